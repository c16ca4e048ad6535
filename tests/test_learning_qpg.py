"""Learning tests (default settings): SAC and TD3 reach a mean return of -250 on Pendulum-v1 within 20,000 env
steps, DDPG -300 within 30,000 (fixed seeds, compiled update, small networks).

The return is the mean over the episodes of one log interval (2,000 steps: 10 episodes); a run stops
as soon as an interval reaches the threshold.
"""
import dataclasses

import pytest

from fnrl.algos import default_config
from fnrl.train import train

# The defaults are Pendulum settings: small nets, one 256-sample update per 4 env steps (8 envs).


@pytest.mark.slow
@pytest.mark.parametrize("name, steps, threshold", [("sac", 20_000, -250.0), ("td3", 20_000, -250.0),
                                                     ("ddpg", 30_000, -300.0)])
def test_pendulum(name, steps, threshold, tmp_path):
    config = dataclasses.replace(default_config(name), env_id="Pendulum-v1", total_steps=steps)
    result = train(name, config, seed=0, log_dir=tmp_path / "run", compile=True, quiet=True, log_interval=2_000,
                   tensorboard=False, plot=False, stop_return=threshold)
    returns = [round(row["return_mean"]) for row in result.history]
    print(f"{name}: final return {result.return_mean:.1f}; per 2k steps {returns}")
    assert result.return_mean >= threshold, f"{name}: returns per 2k steps {returns}"
