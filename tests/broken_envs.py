"""Envs that break what fnrl relies on, one way each, for `fnrl check-env`'s tests:
`fnrl check-env tests.broken_envs:NoEnd-v0`."""
import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    """A 1-d random walk; `end_at`: |position| that ends an episode (None: never);
    `nan_at`: the step that returns a NaN observation; `seeded`: draw from the env's own generator."""

    def __init__(self, end_at=5.0, nan_at=None, seeded=True):
        self.end_at, self.nan_at, self.seeded = end_at, nan_at, seeded
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def _noise(self) -> float:
        return float(self.np_random.normal() if self.seeded else np.random.default_rng().normal())

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = self._noise(), 0
        return np.array([self.x], np.float32), {}

    def step(self, action):
        self.x += (1.0 if action else -1.0) * 0.5 + self._noise()
        self.t += 1
        obs = np.array([np.nan if self.t == self.nan_at else self.x], np.float32)
        ended = self.end_at is not None and abs(self.x) >= self.end_at
        return obs, 1.0, ended, False, {}


for name, kwargs in {"Walk-v0": {}, "NoEnd-v0": {"end_at": None}, "NaNObs-v0": {"nan_at": 3},
                     "Unseeded-v0": {"seeded": False}}.items():
    if name not in gym.registry:
        gym.register(name, entry_point=Walk, kwargs=kwargs)
