"""Learning tests: PPO's CartPole preset learns through the alternating and parallel samplers.

One seed per sampler (these samplers train one seed), the preset's whole 100k env steps, judged on
the final evaluation without exploration (10 episodes on separate envs): a mean return >= 475.
In the matrix (`python -m pytest -m matrix`): tests/test_samplers.py checks that both samplers give
the serial sampler's rollouts, whose learning tests/test_learning_ppo.py tests.
"""
import pytest

from fnrl.train import train
from tests.learning import final_evaluations


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("sampler", ["alternating", "parallel"])
def test_ppo_learns_cartpole_with_sampler(sampler, tmp_path):
    result = train("ppo", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False,
                   sampler=sampler, sampler_workers=2 if sampler == "parallel" else None)
    assert result.history[-1]["env_steps"] <= 100_352
    assert final_evaluations(result)[0] >= 475
