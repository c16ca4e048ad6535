"""`fnrl check-env`: each way an env breaks fnrl's contract is found and named, with exit code 1."""
from __future__ import annotations

import pytest

from fnrl.cli import main
from fnrl.envs.check import check_env


def _failed(env_id: str, **kwargs) -> dict:
    return {c.name: c.detail for c in check_env(env_id, kwargs or None, steps=200) if not c.ok}


def test_a_sound_env_passes_every_check():
    checks = check_env("tests.broken_envs:Walk-v0", steps=200)
    assert [c.name for c in checks] == ["made", "gymnasium", "observations", "rewards", "episodes", "determinism"]
    assert all(c.ok for c in checks), checks


@pytest.mark.parametrize("env_id,check,says", [
    ("NoEnd-v0", "episodes", "no time limit"),
    ("NaNObs-v0", "observations", "at step 3: not finite"),
    ("Unseeded-v0", "determinism", "differ in obs"),
])
def test_a_broken_env_fails_the_check_that_names_its_fault(env_id, check, says):
    failed = _failed(f"tests.broken_envs:{env_id}")
    assert check in failed and says in failed[check], failed


def test_env_kwargs_reach_the_env_and_the_command_exits_1_on_a_failure(capsys):
    assert _failed("tests.broken_envs:Walk-v0", end_at=None).keys() == {"episodes"}
    assert main(["check-env", "tests.broken_envs:Walk-v0", "--env-kwargs", '{"end_at": null}', "--steps", "100"]) == 1
    out = capsys.readouterr().out
    assert "FAIL episodes: none ended in 100 steps" in out and "ok   determinism" in out
    assert main(["check-env", "CartPole-v1", "--steps", "100"]) == 0
