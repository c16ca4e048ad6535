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

`snapshot` / `restore` save and continue the envs mid-episode as plain data (numbers, strings,
arrays: what a checkpoint may hold without running code when it is read, `fnrl.run.plain`):
the attributes of every wrapper layer and of the env itself, and its random generator's state.
"""
from __future__ import annotations

import copy
import json

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

_REBUILT = (gym.Env, gym.spaces.Space, EnvSpec)
"""What a fresh env of the same id builds again by itself (an inner env, spaces, the spec): left
out of a snapshot; an attribute of any other type that is not plain data rules the snapshot out."""

GENERATOR = "__numpy_generator_state__"
"""The key under which a snapshot holds a `numpy.random.Generator`'s state (JSON)."""

BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
"""The numpy bit generators a snapshot may name."""


class InProcessEnvs:
    """`num_envs` copies of `gym.make(env_id, **kwargs)` (or of `env_id(**kwargs)`, for an env
    factory) as one batch.

    `reset(seed=s)` -> (obs [B, *obs], {}) and `step(actions [B, *action])` ->
    (obs, reward [B] float32, terminated [B] bool, truncated [B] bool, {}). An env that
    ended on the previous step is reset instead of stepped: that step returns the reset
    observation, reward 0 and no end flags, and ignores the env's action. Observations are
    fresh arrays each step (stacked copies, even of an env that returns one array it
    mutates), in the observation space's dtype; a Dict observation is a dict of such arrays.

    Image observations in channels-last layout ([H, W, C] uint8 with C of 1, 3 or 4:
    `channels_last`) are given channels-first, [C, H, W], as fnrl's conv torsos take them, and
    `single_observation_space` says so.
    """

    def __init__(self, env_id: str, num_envs: int, **kwargs):
        self.envs = [gym.make(env_id, **kwargs) if isinstance(env_id, str) else env_id(**kwargs)
                     for _ in range(num_envs)]
        self.num_envs = num_envs
        self.single_observation_space = self.envs[0].observation_space
        self.transposed = channels_last(self.single_observation_space)
        if self.transposed:
            self.single_observation_space = channels_first_space(self.single_observation_space)
        self.single_action_space = self.envs[0].action_space
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        space = self.single_observation_space
        self._dtypes = ({k: s.dtype for k, s in space.spaces.items()} if isinstance(space, gym.spaces.Dict)
                        else space.dtype)
        self._ended = [False] * num_envs

    def _stack(self, observations: list):
        if isinstance(self._dtypes, dict):
            return {k: np.array([o[k] for o in observations], dtype=d) for k, d in self._dtypes.items()}
        if self.transposed:
            return channels_first(np.array(observations, dtype=self._dtypes))
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

    def snapshot(self) -> dict | None:
        """The envs as they stand, as plain data: each env's layers (wrappers, then the env), their
        plain attributes (state, elapsed steps, flags) and the env's random generator; None where
        an env holds state that is not plain data (e.g. a simulator handle or a window)."""
        envs = [_env_snapshot(env) for env in self.envs]
        if any(layers is None for layers in envs):
            return None
        return {"envs": envs, "ended": list(self._ended)}

    def restore(self, snapshot: dict) -> None:
        """Continue from `snapshot()`'s envs: their attributes set on these envs, made alike."""
        envs = snapshot["envs"]
        if len(envs) != self.num_envs:
            raise ValueError(f"a snapshot of {len(envs)} envs for {self.num_envs}")
        for env, layers in zip(self.envs, envs):
            _restore_env(env, layers)
        self._ended = [bool(e) for e in snapshot["ended"]]

    def render(self) -> tuple:
        """Each env's `render()` (envs made with a `render_mode`)."""
        return tuple(env.render() for env in self.envs)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def channels_last(space) -> bool:
    """Whether `space` holds images in channels-last layout: a uint8 Box [H, W, C], C in 1, 3, 4
    and H, W larger (a channels-first [C, H, W] image has its width last)."""
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and space.shape[-1] in (1, 3, 4) and min(space.shape[:2]) > 4)


def channels_first_space(space: gym.spaces.Box) -> gym.spaces.Box:
    """The [C, H, W] space of a channels-last image space (`channels_last`)."""
    low, high = (np.moveaxis(bound, -1, 0) for bound in (space.low, space.high))
    return gym.spaces.Box(low, high, dtype=np.uint8)


def channels_first(images: np.ndarray) -> np.ndarray:
    """A batch of channels-last images [B, H, W, C] as a contiguous [B, C, H, W] array."""
    return np.ascontiguousarray(np.asarray(images).transpose(0, 3, 1, 2))


class ChannelsFirst:
    """A gymnasium vector env whose observations are channels-last images (`channels_last`),
    handing them on as [B, C, H, W], with `single_observation_space` [C, H, W]: what
    `fnrl.envs.make` does with such a vector env, as `InProcessEnvs` does for its own envs."""

    def __init__(self, vector):
        self.vector = vector
        self.num_envs = vector.num_envs
        self.metadata = vector.metadata
        self.single_observation_space = channels_first_space(vector.single_observation_space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, vector.num_envs)
        self.single_action_space = vector.single_action_space
        self.action_space = vector.action_space

    def __getattr__(self, name: str):   # the rest of the vector env's interface (render_mode, call, ...)
        if name == "vector":
            raise AttributeError(name)
        return getattr(self.vector, name)

    def reset(self, **kwargs) -> tuple:
        obs, info = self.vector.reset(**kwargs)
        return channels_first(obs), info

    def step(self, actions) -> tuple:
        obs, *rest = self.vector.step(actions)
        return (channels_first(obs), *rest)

    def render(self):
        return self.vector.render()

    def close(self) -> None:
        self.vector.close()


def _layers(env) -> list:
    """The wrapper layers of `env`, outermost first, then the env itself."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, np.generic)):
        return True
    if isinstance(value, np.ndarray):
        return not value.dtype.hasobject
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _env_snapshot(env) -> list[dict] | None:
    """[the plain attributes of each layer of `env`], the generator's state as JSON under
    `_np_random` (its 128-bit integers do not fit a tensor); None if a layer holds another value."""
    layers = []
    for layer in _layers(env):
        values = {}
        for key, value in vars(layer).items():
            if isinstance(value, np.random.Generator):
                values[key] = {GENERATOR: json.dumps(value.bit_generator.state)}
            elif _plain(value):
                values[key] = copy.deepcopy(value)
            elif not isinstance(value, _REBUILT):
                return None
        layers.append(values)
    return layers


def _restore_env(env, layers: list[dict]) -> None:
    own = _layers(env)
    if len(own) != len(layers):
        raise ValueError(f"a snapshot of an env with {len(layers)} layers for one with {len(own)}")
    for layer, values in zip(own, layers):
        for key, value in values.items():
            if isinstance(value, dict) and set(value) == {GENERATOR}:
                state = json.loads(value[GENERATOR])
                if state.get("bit_generator") not in BIT_GENERATORS:
                    raise ValueError(f"a snapshot names an unknown bit generator {state.get('bit_generator')!r}")
                value = np.random.Generator(getattr(np.random, state["bit_generator"])())
                value.bit_generator.state = state
            else:
                value = copy.deepcopy(value)
            setattr(layer, key, value)
