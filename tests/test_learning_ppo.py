"""Learning tests: real runs that must reach a return threshold (CI runs them)."""
import pytest

from fnrl.train import train


@pytest.mark.slow
def test_ppo_default_run_solves_cartpole(tmp_path):
    """`fnrl train ppo` with no options: return_mean >= 475 within 100k env steps (the run stops there)."""
    result = train("ppo", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, stop_return=475)
    assert result.history[-1]["env_steps"] <= 100_352
    assert result.return_mean >= 475


@pytest.mark.slow
def test_a2c_learns_cartpole(tmp_path):
    """A2C reaches >= 400 within 300k env steps."""
    result = train("a2c", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False,
                   stop_return=400)
    assert result.history[-1]["env_steps"] <= 300_000
    assert result.return_mean >= 400
