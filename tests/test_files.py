"""fnrl.files: a file is written whole or not at all, through a unique temporary name."""
import pytest

from fnrl.files import replacing, temporary_beside


def test_a_write_replaces_the_file_and_a_failed_one_leaves_it_and_no_temporary(tmp_path):
    path = tmp_path / "curve.png"
    path.write_text("old")
    with replacing(path) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".curve.")
        tmp.write_text("new")
    assert path.read_text() == "new"
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["curve.png"]
    assert temporary_beside(path) != temporary_beside(path)
