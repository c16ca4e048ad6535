"""Test-only environments with hand-checkable episodes, and an optimizer wrapper."""
import gymnasium as gym
import numpy as np

from fnrl.optim import GradientTransformation


def leaves_only(tx: GradientTransformation) -> GradientTransformation:
    """`tx` with a TensorDict `update` that refuses to run: a step that succeeds ran `update_leaves`."""
    def refuse(*args):
        raise AssertionError("the TensorDict update ran")

    return GradientTransformation(tx.init, refuse, tx.update_leaves)


class CountEnv(gym.Env):
    """obs = [k] (steps taken in this episode), reward = 1 + k_before / 10.

    Terminates when k reaches `terminate_at` (if given); TimeLimit truncates otherwise.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at=None):
        self.terminate_at = terminate_at
        self.k = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        reward = 1.0 + self.k / 10
        self.k += 1
        terminated = self.terminate_at is not None and self.k >= self.terminate_at
        return np.array([self.k], np.float32), reward, terminated, False, {}


def register_count_envs():
    if "fnrltest/CountTerm-v0" not in gym.registry:
        gym.register("fnrltest/CountTerm-v0", entry_point=CountEnv, kwargs={"terminate_at": 3})
        gym.register("fnrltest/CountTrunc-v0", entry_point=CountEnv, max_episode_steps=3)
        gym.register("fnrltest/DictObs-v0", entry_point=DictObsEnv)


class DictObsEnv(gym.Env):
    """A Dict observation space: {"pos": [2], "flag": [1]}; terminates after 4 steps."""

    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,), np.float32),
                                         "flag": gym.spaces.Box(0, 1, (1,), np.float32)})
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": np.full(2, self.k / 10, np.float32), "flag": np.array([self.k % 2], np.float32)}

    def step(self, action):
        self.k += 1
        return self._obs(), float(action), self.k >= 4, False, {}
