"""`fnrl bench`: the suite runs its contenders in subprocesses and writes one table."""
import pytest

from fnrl.cli import main


def test_bench_writes_one_row_per_workload(tmp_path, capsys):
    out = tmp_path / "suite.md"
    assert main(["bench", "--only", "ppo-cartpole-4", "--steps", "1024", "--contenders", "raw,eager",
                 "--out", str(out)]) == 0
    report = out.read_text()
    row = next(line for line in report.splitlines() if line.startswith("| ppo-cartpole-4 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1,024"
    raw, eager = (float(cells[i].replace(",", "")) for i in (2, 5))
    assert raw > 0 and eager > 0
    assert cells[3] == "missing: not run"            # compiled was not asked for
    assert "nproc=" in report and "| workload |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--only", "nope"], "unknown workload(s) nope"),
    (["--contenders", "raw,jax"], "unknown contender(s) jax"),
])
def test_bench_bad_option_is_one_line(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
