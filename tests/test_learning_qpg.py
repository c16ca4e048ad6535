"""Learning tests for SAC, TD3 and DDPG on Pendulum-v1 with their presets (real runs, CI runs them).

4 seeds (0-3: none was used to tune a preset) in one vmapped run of the preset's 20k env steps per
seed, judged on each seed's final evaluation without exploration (10 episodes on separate envs):
at most one seed below -250, none below -500 (a random policy scores about -1,200). SAC with gSDE
on MountainCarContinuous-v0 (its preset, rl-zoo3's settings: 50k steps; `matrix` marker, ~6
CPU-minutes): 2 seeds, both at 90 or more (the car reaches the flag; a policy that stays put scores 0).
DDPG's run carries the `matrix` marker too: it is TD3's loop and update with the clipped double Q,
the delayed actor and the target smoothing switched off (tests/test_qpg.py checks DDPG's update).
"""
import pytest

from fnrl.presets import configure
from fnrl.train import train
from tests.learning import assert_most_seeds_reach


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sac", "td3", pytest.param("ddpg", marks=pytest.mark.matrix)])
def test_pendulum_on_four_seeds(name, tmp_path):
    config, preset = configure(name, "Pendulum-v1")
    assert preset == f"{name}/Pendulum-v1" and config.total_steps == 20_000
    result = train(name, config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert_most_seeds_reach(result, -250, floor=-500)


@pytest.mark.slow
@pytest.mark.matrix
def test_sde_sac_drives_the_mountain_car_up_on_two_seeds(tmp_path):
    config, preset = configure("sac", "MountainCarContinuous-v0")
    assert preset == "sac/MountainCarContinuous-v0" and config.use_sde
    result = train("sac", config, seed=0, num_seeds=2, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert_most_seeds_reach(result, 90, floor=90, misses=0)
