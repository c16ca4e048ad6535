"""Gymnasium envs stepped one after another in the caller's thread, with next-step autoreset.

`InProcessEnvs` is what `fnrl.envs.make(..., backend="gymnasium")` (and "auto" for up to 4
classic-control envs) steps: the part of gymnasium's `SyncVectorEnv` that `BatchedEnv` uses,
and no more. `SyncVectorEnv` iterates the batched action through its space, merges every
env's info dict into a batched one and deep-copies the observations each step; fnrl reads
no gymnasium info, so here a step is the envs' own `step` calls and one stack of their
observations: `BatchedEnv.step_arrays` over 1-8 CartPole or Pendulum envs is 1.0-1.6x as
fast (`benchmarks/probes/env_step.md`, 2-core CPU). Same seeding (env i of `reset(seed=s)` gets
`s + i`) and the same autoreset as `SyncVectorEnv(autoreset_mode=NEXT_STEP)`, so both give
the same steps (`tests/test_envs.py::test_in_process_envs_step_as_gymnasium_sync_vector_env`).
"""
from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np


class InProcessEnvs:
    """`num_envs` copies of `gym.make(env_id, **kwargs)` as one batch.

    `reset(seed=s)` -> (obs [B, *obs], {}) and `step(actions [B, *action])` ->
    (obs, reward [B] float32, terminated [B] bool, truncated [B] bool, {}). An env that
    ended on the previous step is reset instead of stepped: that step returns the reset
    observation, reward 0 and no end flags, and ignores the env's action. Observations are
    fresh arrays each step (stacked copies, even of an env that returns one array it
    mutates), in the observation space's dtype; a Dict observation is a dict of such arrays.
    """

    def __init__(self, env_id: str, num_envs: int, **kwargs):
        self.envs = [gym.make(env_id, **kwargs) for _ in range(num_envs)]
        self.num_envs = num_envs
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        space = self.single_observation_space
        self._dtypes = ({k: s.dtype for k, s in space.spaces.items()} if isinstance(space, gym.spaces.Dict)
                        else space.dtype)
        self._ended = [False] * num_envs

    def _stack(self, observations: list):
        if isinstance(self._dtypes, dict):
            return {k: np.array([o[k] for o in observations], dtype=d) for k, d in self._dtypes.items()}
        return np.array(observations, dtype=self._dtypes)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple:
        """Reset every env: env i with seed `seed + i` (or `seed[i]`, for a list; None: unseeded)."""
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        elif len(seed) == self.num_envs:
            seeds = list(seed)
        else:
            raise ValueError(f"{len(seed)} seeds for {self.num_envs} envs")
        observations = [env.reset(seed=s, options=options)[0] for env, s in zip(self.envs, seeds)]
        self._ended = [False] * self.num_envs
        return self._stack(observations), {}

    def step(self, actions) -> tuple:
        n = self.num_envs
        observations, rewards = [None] * n, [0.0] * n
        terminated, truncated = [False] * n, [False] * n
        for i, env in enumerate(self.envs):
            if self._ended[i]:
                observations[i] = env.reset()[0]
            else:
                observations[i], rewards[i], terminated[i], truncated[i], _ = env.step(actions[i])
        self._ended = [a or b for a, b in zip(terminated, truncated)]
        return (self._stack(observations), np.array(rewards, dtype=np.float32), np.array(terminated, dtype=bool),
                np.array(truncated, dtype=bool), {})

    def snapshot(self) -> bytes | None:
        """The envs as they stand (pickled: their states, time limits and random generators), or
        None where an env does not pickle (e.g. one holding a simulator handle or a window)."""
        try:
            return pickle.dumps((self.envs, self._ended))
        except Exception:   # noqa: BLE001 - whatever stops pickling: no snapshot
            return None

    def restore(self, snapshot: bytes) -> None:
        """Continue from `snapshot()`'s envs (closing the current ones)."""
        envs, ended = pickle.loads(snapshot)
        if len(envs) != self.num_envs:
            raise ValueError(f"a snapshot of {len(envs)} envs for {self.num_envs}")
        self.close()
        self.envs, self._ended = envs, list(ended)

    def render(self) -> tuple:
        """Each env's `render()` (envs made with a `render_mode`)."""
        return tuple(env.render() for env in self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()
