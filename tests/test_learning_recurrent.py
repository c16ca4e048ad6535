"""Recurrent PPO learns the partially observed fnrl/CartPoleNoVel-v1 (positions only);
feed-forward PPO with the same settings and budget cannot (it cannot infer velocities)."""
import dataclasses

import pytest

from fnrl.algos import ppo
from fnrl.train import train

# 200k env steps (under the 300k budget); eager: a cold compile of the 32-step
# unrolled LSTM gradient costs minutes on a small CPU, more than the whole run.
NOVEL = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", total_steps=200_000, num_envs=64, num_steps=32,
                   update_epochs=8, num_minibatches=2, normalize_obs=True, core="lstm", core_size=64,
                   hidden=(64,))


def _run(config, stop_return=None):
    return train("ppo", config, seed=0, compile=False, quiet=True, tensorboard=False, plot=False,
                 log_dir=None, stop_return=stop_return)


@pytest.mark.slow
def test_recurrent_ppo_learns_cartpole_without_velocities_and_feed_forward_does_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default log dirs under runs/ land in the temporary folder
    recurrent = _run(NOVEL, stop_return=400)  # stops at the first log interval with a mean return >= 400
    assert recurrent.return_mean >= 400, [r["return_mean"] for r in recurrent.history[-10:]]
    feed_forward = _run(dataclasses.replace(NOVEL, core="none"))
    assert feed_forward.return_mean < 100, feed_forward.return_mean
