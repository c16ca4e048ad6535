"""Learning tests for the DQN family (real runs, CI runs them).

CartPole-v1 with each variant's preset (`fnrl/presets`): seeds from 0 (none of them used to tune a
preset) in one vmapped run of the preset's budget, judged on each seed's final evaluation without
exploration (10 episodes on separate envs): at most one seed below the bar, none below the floor.
The bars sit under what every tuning seed of the preset reached (`fnrl/presets`' notes), so a
working variant passes on other hardware too; the 50k-step variants run 4 seeds, the 100k-step ones
2. All but dqn carry the `matrix` marker (`python -m pytest -m matrix`; about 21 CPU-minutes between
them, so the default run leaves them out and keeps under CI's time; their 8-seed cells are in
`fnrl bench --learning`). Atari: the Nature-CNN path of dqn and rainbow (frame-deduplicated,
n-step, prioritized replay) runs a few hundred Pong steps with finite losses.
"""
import dataclasses
import math

import pytest

from fnrl.algos import default_config
from fnrl.presets import configure
from fnrl.train import train
from tests.learning import assert_most_seeds_reach


@pytest.mark.slow
@pytest.mark.parametrize("variant, seeds, bar", [("dqn", 4, 450)] + [
    pytest.param(v, seeds, bar, marks=pytest.mark.matrix)
    for v, seeds, bar in [("qrdqn", 4, 450), ("c51", 2, 400), ("rainbow", 2, 400), ("iqn", 2, 400)]])
def test_learns_cartpole_on_several_seeds(variant, seeds, bar, tmp_path):
    config, preset = configure(variant, "CartPole-v1")
    assert preset == f"{variant}/CartPole-v1"
    result = train(variant, config, seed=0, num_seeds=seeds, log_dir=tmp_path / "run", quiet=True,
                   tensorboard=False, plot=False)
    assert_most_seeds_reach(result, bar, floor=200)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dqn", "rainbow"])
def test_atari_network_path(variant, tmp_path):
    """A few hundred Pong-v5 steps through the Nature CNN, frame-deduplicated replay and updates."""
    config = dataclasses.replace(default_config(variant), env_id="Pong-v5", num_envs=2, num_steps=8,
                                 total_steps=384, buffer_size=1_000, batch_size=8, learning_starts=128,
                                 replay_ratio=0.125, target_update_interval=4, v_min=-10.0, v_max=10.0,
                                 learning_rate=1e-4)
    result = train(variant, config, seed=0, log_dir=tmp_path / "pong", compile=False, quiet=True, log_interval=64,
                   tensorboard=False, plot=False, eval_episodes=0)   # whole Pong games: minutes
    losses = [row["loss/q"] for row in result.history if "loss/q" in row]
    assert result.history[-1]["env_steps"] == 384
    assert result.state["updates"].item() == 17 * 2  # collects at env steps 128, 144, ..., 384: 2 updates each
    assert losses and all(math.isfinite(x) for x in losses)
    assert "torso.net.0.weight" in result.state["params"].flatten_keys(".").keys()
