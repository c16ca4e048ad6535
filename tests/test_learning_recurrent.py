"""Recurrent PPO learns the partially observed fnrl/CartPoleNoVel-v1 (positions only);
feed-forward PPO with the same settings and budget cannot (it cannot infer velocities)."""
import dataclasses

import pytest

from fnrl.algos import ppo
from fnrl.train import train
from tests.learning import final_evaluations

# 200k env steps (under a 300k budget); eager: a cold compile of the 32-step
# unrolled LSTM gradient costs minutes on a small CPU, more than the whole run.
NOVEL = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", total_steps=200_000, num_envs=64, num_steps=32,
                   update_epochs=8, num_minibatches=2, normalize_obs=True, core="lstm", core_size=64,
                   hidden=(64,))

LSTM_BAR = 150   # the LSTM's final evaluation reaches it, the feed-forward policy's does not


def _final_evaluation(config) -> float:
    result = train("ppo", config, seed=0, compile=False, quiet=True, tensorboard=False, plot=False, log_dir=None)
    return final_evaluations(result)[0]


@pytest.mark.slow
def test_recurrent_ppo_learns_cartpole_without_velocities_and_feed_forward_does_not(tmp_path, monkeypatch):
    """The whole 200k env steps each (one seed: recurrent policies train one seed per run), judged on
    the final evaluation without exploration (10 episodes): the LSTM gets past 150, which the
    feed-forward policy does not reach. Every LSTM run measured ended between 179 and 500, but only
    some at 400 or more (docs/learning.md): the bar is the one every run reached."""
    monkeypatch.chdir(tmp_path)  # default log dirs under runs/ land in the temporary folder
    assert _final_evaluation(NOVEL) >= LSTM_BAR
    assert _final_evaluation(dataclasses.replace(NOVEL, core="none")) < LSTM_BAR
