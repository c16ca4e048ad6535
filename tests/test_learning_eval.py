"""Learning test for evaluation: a trained CartPole agent scores 500 in every eval episode."""
import math

import pytest

from fnrl import algos
from fnrl.evaluate import evaluate_state
from fnrl.train import train


@pytest.mark.slow
def test_trained_cartpole_agent_evaluates_to_500(tmp_path):
    """PPO (the CartPole preset, seed 1) trained for its whole run (100k env steps, the learning rate
    annealed to 0), evaluated every 25k env steps: the final row's evaluation is 500 in every
    episode, and 10 offline greedy episodes of the final state on other envs all return exactly 500."""
    result = train("ppo", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False,
                   eval_interval=25_000, eval_episodes=10)
    evaluated = [r["env_steps"] for r in result.history if math.isfinite(r["eval_return_mean"])]
    assert evaluated[-1] == result.history[-1]["env_steps"] and len(evaluated) >= 4
    assert result.history[-1]["eval_return_mean"] == 500 and result.history[-1]["eval_return_std"] == 0
    assert result.eval_returns == [[500.0] * 10]
    config = algos.default_config("ppo")
    assert evaluate_state("ppo", config, result.state, episodes=10, seed=123) == [500.0] * 10
