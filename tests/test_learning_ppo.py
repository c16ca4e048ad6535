"""Learning tests for PPO and A2C on CartPole-v1 with their presets (real runs, CI runs them).

Several seeds in one vmapped run of the preset's budget (seeds 0-7 and 0-3: none was used to tune a
preset), judged on each seed's final evaluation without exploration (10 episodes on separate envs):
at most one seed below 475, none below 200.
"""
import pytest

from fnrl.presets import configure
from fnrl.train import train
from tests.learning import assert_most_seeds_reach


@pytest.mark.slow
def test_ppo_solves_cartpole_on_eight_seeds(tmp_path):
    """`fnrl train ppo --num-seeds 8`: the preset's 100k env steps per seed."""
    result = train("ppo", None, seed=0, num_seeds=8, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert sorted({row["seed"] for row in result.history}) == list(range(8))
    assert result.history[-1]["env_steps"] <= 100_352
    assert_most_seeds_reach(result, 475, floor=200)


@pytest.mark.slow
def test_a2c_solves_cartpole_on_four_seeds(tmp_path):
    config, preset = configure("a2c", "CartPole-v1")
    assert preset == "a2c/CartPole-v1"
    result = train("a2c", config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert_most_seeds_reach(result, 475, floor=200)
