"""Learning tests for the DQN family (real runs, fixed seeds, CI runs them).

CartPole-v1 with each variant's default settings (`fnrl.algos.dqn.VARIANTS`): the mean return
of the episodes finished in a 2,000-step log interval must reach the threshold within the
step budget (a run stops at the first interval that does). Atari: the Nature-CNN path of dqn
and rainbow (frame-deduplicated, n-step, prioritized replay) runs a few hundred Pong steps
with finite losses.
"""
import dataclasses
import math

import pytest

from fnrl.algos import default_config
from fnrl.train import train

CARTPOLE = [  # variant, env steps, threshold
    ("dqn", 100_000, 450.0),
    ("c51", 100_000, 400.0),
    ("rainbow", 100_000, 400.0),
    ("qrdqn", 100_000, 400.0),
    ("iqn", 100_000, 400.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("variant, steps, threshold", CARTPOLE)
def test_learns_cartpole(variant, steps, threshold, tmp_path):
    config = dataclasses.replace(default_config(variant), total_steps=steps)
    result = train(variant, config, seed=0, log_dir=tmp_path / "run", compile=True, quiet=True, log_interval=2_000,
                   tensorboard=False, plot=False, stop_return=threshold)
    curve = [(row["env_steps"], round(row["return_mean"])) for row in result.history
             if math.isfinite(row["return_mean"])]
    assert result.history[-1]["env_steps"] <= steps + config.num_envs * config.num_steps
    assert max(r for _, r in curve) >= threshold, f"{variant}: (env steps, return) {curve}"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dqn", "rainbow"])
def test_atari_network_path(variant, tmp_path):
    """A few hundred Pong-v5 steps through the Nature CNN, frame-deduplicated replay and updates."""
    config = dataclasses.replace(default_config(variant), env_id="Pong-v5", num_envs=2, num_steps=8,
                                 total_steps=384, buffer_size=1_000, batch_size=8, learning_starts=128,
                                 replay_ratio=0.125, target_update_interval=4, v_min=-10.0, v_max=10.0,
                                 learning_rate=1e-4)
    result = train(variant, config, seed=0, log_dir=tmp_path / "pong", compile=False, quiet=True, log_interval=64,
                   tensorboard=False, plot=False)
    losses = [row["loss/q"] for row in result.history if "loss/q" in row]
    assert result.history[-1]["env_steps"] == 384
    assert result.state["updates"].item() == 17 * 2  # collects at env steps 128, 144, ..., 384: 2 updates each
    assert losses and all(math.isfinite(x) for x in losses)
    assert "torso.net.0.weight" in result.state["params"].flatten_keys(".").keys()
