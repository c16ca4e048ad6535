"""Learning tests for SAC, TD3 and DDPG on Pendulum-v1 with their presets (real runs, CI runs them).

4 seeds (0-3: none was used to tune a preset) in one vmapped run of the preset's 20k env steps per
seed, judged on each seed's final evaluation without exploration (10 episodes on separate envs):
at most one seed below -250, none below -500 (a random policy scores about -1,200).
"""
import pytest

from fnrl.presets import configure
from fnrl.train import train
from tests.learning import assert_most_seeds_reach


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sac", "td3", "ddpg"])
def test_pendulum_on_four_seeds(name, tmp_path):
    config, preset = configure(name, "Pendulum-v1")
    assert preset == f"{name}/Pendulum-v1" and config.total_steps == 20_000
    result = train(name, config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert_most_seeds_reach(result, -250, floor=-500)
