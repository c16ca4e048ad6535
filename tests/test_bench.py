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
    (["--device", "tpu"], "unknown device tpu"),
    *([(["--device", "cuda"], "no CUDA device")] if not __import__("torch").cuda.is_available() else []),
])
def test_bench_bad_option_is_one_line(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_run_that_refuses_cuda_graphs_is_trained_without_them(tmp_path, monkeypatch):
    """`fnrl bench --device cuda` asks every compiled run for CUDA graphs; a run that refuses them
    (a one-line ConfigError before any work) trains without. Here the refusal is the CPU's."""
    import dataclasses
    import importlib.util
    import sys
    from pathlib import Path

    from fnrl import algos

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "suite.py"
    spec = importlib.util.spec_from_file_location("fnrl_suite_for_test", path)
    suite = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, suite)   # its dataclasses look their module up
    spec.loader.exec_module(suite)
    config = dataclasses.replace(algos.default_config("ppo"), total_steps=512)
    result = suite._train_graphed_where_allowed("ppo", config, seed=0, log_dir=tmp_path / "run", compile=False,
                                                quiet=True, tensorboard=False, plot=False, cuda_graphs=True)
    assert result.history[-1]["env_steps"] == 512
