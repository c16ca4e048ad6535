"""Learning test for R2D1 (a real run, fixed seed): CartPole-v1 with the default Config.

The mean return of the episodes finished in a 2,000-step log interval must reach 400 within
60,000 env steps (the issue asks for 150,000; seed 0 gets there near 50,000). Eager updates:
the compile of a sequence unroll costs minutes on a busy 2-core machine, more than it saves
in ~600 updates.
"""
import dataclasses
import math

import pytest

from fnrl.algos import r2d1
from fnrl.train import train


@pytest.mark.slow
def test_r2d1_learns_cartpole(tmp_path):
    steps, threshold = 60_000, 400.0
    config = dataclasses.replace(r2d1.Config(), total_steps=steps)
    result = train("r2d1", config, seed=0, log_dir=tmp_path / "run", compile=False, quiet=True, log_interval=2_000,
                   tensorboard=False, plot=False, stop_return=threshold)
    curve = [(row["env_steps"], round(row["return_mean"])) for row in result.history
             if math.isfinite(row["return_mean"])]
    assert result.history[-1]["env_steps"] <= steps + config.num_envs * config.num_steps
    assert max(r for _, r in curve) >= threshold, f"(env steps, return) {curve}"
