"""A user's own env through gymnasium's `module:Env-v0` form: the module is imported (it registers
the env), and the run keeps the whole id, so sampler workers, the final evaluation and a later
`fnrl eval` in a fresh process rebuild the same env."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from fnrl import envs
from fnrl.errors import ConfigError
from fnrl.presets import configure
from fnrl.train import train

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
    """The `fnrl` command in `cwd`. `-P`: the working directory is not put on sys.path by Python,
    as for the installed `fnrl` script (which `python -m fnrl` would hide); fnrl puts it there."""
    return subprocess.run([sys.executable, "-P", "-m", "fnrl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_run_on_a_users_env_rebuilds_it_in_workers_evaluation_and_a_fresh_eval(tmp_path):
    train = _fnrl("train", "ppo", "--env", USER_ENV, "--total-steps", "2048", "--num-envs", "2", "--num-steps", "32",
                  "--sampler", "parallel", "--sampler-workers", "2", "--no-compile", "--quiet", "--log-dir", "run",
                  cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-2000:]
    assert f"final evaluation {EPISODE_RETURN:.2f}" in train.stdout   # every episode runs to its time limit
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["env_id"] == USER_ENV
    evaluated = _fnrl("eval", "run", "--episodes", "2", cwd=tmp_path)
    assert evaluated.returncode == 0 and f"return mean {EPISODE_RETURN:.2f}" in evaluated.stdout, evaluated.stderr


CORRIDOR = '''
"""A user's package: an env that registers itself when `mypkg.envs` is imported."""
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk a corridor of `length` cells, one cell per step whatever the action; reward 1 a step."""

    def __init__(self, length: int = 10):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.cell += 1
        return np.array([self.cell / self.length], np.float32), 1.0, self.cell == self.length, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=100)
'''


def test_a_users_package_env_with_kwargs_trains_evaluates_and_resumes(tmp_path):
    """The env's module, written here and never registered before, is found from the run's folder's
    parent (the working directory); its kwargs travel in config.json to `fnrl eval` and the resume."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "envs.py").write_text(CORRIDOR)
    common = ["--total-steps", "512", "--num-envs", "2", "--num-steps", "32", "--no-compile", "--quiet"]
    train = _fnrl("train", "ppo", "--env", "mypkg.envs:Corridor-v0", "--env-kwargs", '{"length": 7}', *common,
                  "--log-dir", "run", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-2000:]
    assert "final evaluation 7.00" in train.stdout   # the corridor of the kwargs, not the default 10
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["env_id"] == "mypkg.envs:Corridor-v0" and config["env_kwargs"] == {"length": 7}
    evaluated = _fnrl("eval", "run", "--episodes", "2", cwd=tmp_path)
    assert evaluated.returncode == 0 and "return mean 7.00" in evaluated.stdout, evaluated.stderr[-2000:]
    resumed = _fnrl("train", "ppo", "--resume", "run", "--total-steps", "1024", "--quiet", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "1024 env steps" in resumed.stdout and "final evaluation 7.00" in resumed.stdout


def test_env_kwargs_the_env_refuses_are_one_clear_error():
    with pytest.raises(ConfigError, match="CartPole-v1 refused its env kwargs .*'no_such_kwarg'.*--env-kwargs"):
        envs.make("CartPole-v1", 2, no_such_kwarg=1)
    env = envs.make("CartPole-v1", 1, max_episode_steps=50)   # gymnasium's (and EnvPool's) own time limit
    try:
        assert env.spec.max_episode_steps == 50
    finally:
        env.close()


class Pixels(gym.Env):
    """36 x 36 RGB frames, channels last (as most image envs give them); the frame's colour is the step."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        frame = np.zeros((36, 36, 3), np.uint8)
        frame[..., 0], frame[..., 1], frame[0, 0, 2] = self.t, 2 * self.t, 7
        return frame

    def step(self, action):
        self.t += 1
        return self._frame(), float(action), False, self.t == 10, {}


def test_channels_last_images_reach_the_conv_torso_channels_first(tmp_path):
    if "fnrl-test/Pixels-v0" not in gym.registry:
        gym.register("fnrl-test/Pixels-v0", entry_point=Pixels)
    env = envs.make("fnrl-test/Pixels-v0", 2, seed=[0, 1])
    try:
        assert env.spec.obs_shape == (3, 36, 36) and env.spec.obs_dtype == torch.uint8
        env.reset()
        obs = env.step(torch.tensor([0, 1]))["obs"]
        assert obs.shape == (2, 3, 36, 36) and obs.is_contiguous()
        assert (obs[:, 0] == 1).all() and (obs[:, 1] == 2).all() and obs[0, 2, 0, 0] == 7 and obs[0, 2, 1, 1] == 0
    finally:
        env.close()
    for mode in ("sync", "async"):   # a vector env of them, gymnasium's own or in worker processes, the same
        vector = envs.make(gym.make_vec("fnrl-test/Pixels-v0", 2, vectorization_mode=mode), seed=[0, 1])
        env = envs.make("fnrl-test/Pixels-v0", 2, seed=[0, 1])
        try:
            assert vector.spec.obs_shape == (3, 36, 36) and torch.equal(vector.reset()["obs"], env.reset()["obs"])
            for t in range(12):
                action = torch.tensor([t % 3, 1])
                assert torch.equal(vector.step(action)["obs"], env.step(action)["obs"]), (mode, t)
        finally:
            vector.close()
            env.close()
    config, _ = configure("ppo", "fnrl-test/Pixels-v0", total_steps=256, num_envs=2, num_steps=64)
    result = train("ppo", config, log_dir=tmp_path / "run", compile=False, quiet=True, tensorboard=False,
                   plot=False, eval_episodes=1)
    assert result.eval_returns is not None and len(result.eval_returns[0]) == 1


def test_an_env_factory_and_a_vector_env_step_as_the_registered_id():
    """`fnrl.envs.make` takes `lambda: MyEnv()` and a gymnasium vector env (next-step autoreset) too,
    seeded per env as an id is: the same steps as `make("CartPole-v1", backend="gymnasium")`."""
    made = [envs.make(lambda: gym.make("CartPole-v1"), 3, seed=[1, 2, 3]),
            envs.make(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync"), seed=[1, 2, 3]),
            envs.make("CartPole-v1", 3, seed=[1, 2, 3], backend="gymnasium")]
    try:
        assert all(env.spec == made[-1].spec for env in made)
        first = [env.reset()["obs"] for env in made]
        assert all(torch.equal(obs, first[-1]) for obs in first)
        ended = 0
        for t in range(60):
            steps = [env.step(torch.tensor([t % 2, 1, 0])) for env in made]
            for key in ("obs", "reward", "done", "episode_return"):
                assert all(torch.equal(s[key], steps[-1][key]) for s in steps), (t, key)
            ended += int(steps[-1]["episode_end"].sum())
        assert ended >= 1   # the autoresets agree too
    finally:
        for env in made:
            env.close()
    same_step = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync",
                             vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    with pytest.raises(ConfigError, match="autoreset mode SameStep; fnrl steps next-step autoreset"):
        envs.make(same_step)


def test_env_kwargs_reach_impala_and_gymnasium_only_kwargs_step_gymnasiums_env(tmp_path):
    """IMPALA sizes its network and actors from the same kwargs; a keyword that only gymnasium's
    version of a task takes (CartPole's sutton_barto_reward) makes "auto" step gymnasium's env."""
    config, _ = configure("impala", "CartPole-v1", preset="none", total_steps=2048,
                          env_kwargs={"max_episode_steps": 30})
    result = train("impala", config, log_dir=tmp_path / "run", compile=False, quiet=True, tensorboard=False,
                   plot=False, eval_episodes=2)
    assert max(result.eval_returns[0]) <= 30
    env = envs.make("CartPole-v1", 8, sutton_barto_reward=True)
    try:
        env.reset()
        assert env.spec.num_actions == 2 and type(env.raw).__name__ == "InProcessEnvs"
        assert (env.step(torch.zeros(8, dtype=torch.int64))["reward"] == 0).all()   # Sutton & Barto: 0 until the end
    finally:
        env.close()
