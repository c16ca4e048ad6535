"""A user's own env through gymnasium's `module:Env-v0` form: the module is imported (it registers
the env), and the run keeps the whole id, so sampler workers, the final evaluation and a later
`fnrl eval` in a fresh process rebuild the same env."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from fnrl import envs
from fnrl.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_ENV = "tests.user_env:UserCount-v0"
EPISODE_RETURN = sum(1 + k / 10 for k in range(20))   # CountEnv, truncated at 20 steps: 39


def test_a_module_colon_id_imports_the_module_and_builds_its_env():
    env = envs.make(USER_ENV, 2, seed=[3, 4])
    try:
        assert env.spec.env_id == "UserCount-v0" and env.spec.num_actions == 2 and env.spec.max_episode_steps == 20
        assert envs.known(USER_ENV) and env.seeds == [3, 4]
    finally:
        env.close()


def test_a_module_that_cannot_be_imported_is_one_clear_error():
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'.*PYTHONPATH"):
        envs.make("no_such_module:Env-v0")


def _fnrl(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnrl", *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_run_on_a_users_env_rebuilds_it_in_workers_evaluation_and_a_fresh_eval(tmp_path):
    train = _fnrl("train", "ppo", "--env", USER_ENV, "--total-steps", "2048", "--num-envs", "2", "--num-steps", "32",
                  "--sampler", "parallel", "--sampler-workers", "2", "--no-compile", "--quiet", "--log-dir", "run",
                  cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-2000:]
    assert f"final evaluation {EPISODE_RETURN:.2f}" in train.stdout   # every episode runs to its time limit
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["env_id"] == USER_ENV
    evaluated = _fnrl("eval", "run", "--episodes", "2", cwd=tmp_path)
    assert evaluated.returncode == 0 and f"return mean {EPISODE_RETURN:.2f}" in evaluated.stdout, evaluated.stderr
