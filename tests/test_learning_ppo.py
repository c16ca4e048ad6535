"""Learning tests for PPO and A2C on CartPole-v1 with their presets (real runs, CI runs them).

Several seeds in one vmapped run of the preset's budget (seeds 0-7 and 0-3: none was used to tune a
preset), judged on each seed's final evaluation without exploration (10 episodes on separate envs):
at most one seed below 475, none below 200. The best PPO seed's policy, exported, then balances
the pole without fnrl.
"""
import pathlib
import subprocess
import sys

import pytest

from fnrl.export import export_policy
from fnrl.presets import configure
from fnrl.train import train
from tests.learning import assert_most_seeds_reach, final_evaluations


@pytest.mark.slow
def test_ppo_solves_cartpole_on_eight_seeds(tmp_path):
    """`fnrl train ppo --num-seeds 8`: the preset's 100k env steps per seed."""
    result = train("ppo", None, seed=0, num_seeds=8, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert sorted({row["seed"] for row in result.history}) == list(range(8))
    assert result.history[-1]["env_steps"] <= 100_352
    assert_most_seeds_reach(result, 475, floor=200)
    best = max(range(8), key=lambda k: final_evaluations(result)[k])
    assert_deployed_policy_balances(tmp_path / "run", best)


def assert_deployed_policy_balances(run, row: int) -> None:
    """`experiments/deploy_policy.py` runs the row's policy.pt2 and policy.onnx (`fnrl export`) with
    torch / onnxruntime and gymnasium alone (checked: fnrl is never imported) and balances the pole."""
    script = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "deploy_policy.py"
    for fmt in ("pt2", "onnx"):
        path = export_policy(run, run / f"row{row}.{fmt}", format=fmt, row=row)
        check = (f"import runpy, sys; sys.argv = [{str(script)!r}, {str(path)!r}, '--episodes', '3']; "
                 f"runpy.run_path({str(script)!r}, run_name='__main__'); "
                 "assert not any(m.split('.')[0] == 'fnrl' for m in sys.modules), 'fnrl was imported'")
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert float(done.stdout.strip().splitlines()[-1].split()[-1]) >= 475, done.stdout


@pytest.mark.slow
def test_a2c_solves_cartpole_on_four_seeds(tmp_path):
    config, preset = configure("a2c", "CartPole-v1")
    assert preset == "a2c/CartPole-v1"
    result = train("a2c", config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert_most_seeds_reach(result, 475, floor=200)
