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


def _learning_module():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"
    spec = importlib.util.spec_from_file_location("fnrl_learning_for_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_learning_matrix_statistics_by_hand():
    learning = _learning_module()
    assert learning.iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5            # the mean of 3, 4, 5, 6
    assert learning.iqm([500.0] * 8) == 500.0
    low, high = learning.bootstrap_interval([1, 2, 3, 4, 5, 6, 7, 8])
    assert 1 <= low < 4.5 < high <= 8
    assert learning.bootstrap_interval([500.0] * 8) == (500.0, 500.0)
    goal = learning.BY_KEY["dqn/Acrobot-v1"].goal
    assert goal == pytest.approx(-76.639 - 11.752) and learning.BY_KEY["dqn/CartPole-v1"].goal == 500


def test_learning_matrix_reads_runs_and_renders_a_row(tmp_path):
    learning = _learning_module()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"algo": "dqn", "seed": 0}')
    (run / "progress.csv").write_text("env_steps,seed,return_mean,eval_return_mean\n"
                                      "100,0,nan,nan\n100,1,20.0,nan\n200,0,30.0,480.0\n200,1,40.0,500.0\n")
    runs = learning._read_runs([run])
    assert runs == {0: {"curve": [(200, 30.0)], "eval": 480.0}, 1: {"curve": [(100, 20.0), (200, 40.0)], "eval": 500.0}}
    cell = learning.BY_KEY["dqn/CartPole-v1"]
    row = {**learning.asdict(cell), "goal": cell.goal, "iqm": 500.0, "ci": [490.0, 500.0], "worst": 480.0,
           "reached": 8, "meets_goal": True, "wall_s": 12.0, "singles_wall_s": 30.0, "curves": {}}
    table = learning.render({"cells": {cell.key: row}, "machine": "test machine", "date": "2026-01-01"})
    assert "| dqn | CartPole-v1 | 50k | 500.0 [490.0, 500.0] | 480.0 | 8/8 (>= 475.0) | 500.0 (0.0) | 500.0 | yes |" \
        in table and "test machine" in table


def test_learning_matrix_bad_cell_is_one_line(capsys):
    assert main(["bench", "--learning", "--only", "dqn/Pong"]) == 2
    err = capsys.readouterr().err
    assert "unknown cell(s) dqn/Pong" in err and err.count("\n") == 1
