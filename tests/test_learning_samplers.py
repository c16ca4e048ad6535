"""Learning tests: PPO's default CartPole run solves it through the alternating and parallel samplers."""
import pytest

from fnrl.train import train


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["alternating", "parallel"])
def test_ppo_learns_cartpole_with_sampler(sampler, tmp_path):
    """`fnrl train ppo --sampler NAME`: return_mean >= 475 within 100k env steps (the run stops there)."""
    result = train("ppo", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False,
                   stop_return=475, sampler=sampler, sampler_workers=2 if sampler == "parallel" else None)
    assert result.history[-1]["env_steps"] <= 100_352
    assert result.return_mean >= 475
