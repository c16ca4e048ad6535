"""Batched environments: EnvPool by default, any gymnasium env through an adaptor.

>>> env = make("CartPole-v1", num_envs=8, seed=0)
>>> first = env.reset()                      # TensorDict [8] with "obs"
>>> out = env.step(torch.zeros(8, dtype=torch.int64))   # keys in fnrl.envs.batched
>>> env.spec.num_actions
2
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import importlib
import os
import warnings
from functools import lru_cache

import gymnasium as gym
import numpy as np
import torch

from fnrl.envs.batched import POLL_VAR, BatchedEnv, NUMPY_TO_TORCH
from fnrl.envs.inprocess import ChannelsFirst, InProcessEnvs, channels_last
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError

__all__ = ["make", "BatchedEnv", "EnvSpec", "env_spec", "FNRL_ENVS", "steps_in_process", "envpool_task", "known",
           "POLL_VAR"]

FNRL_ENVS: dict[str, tuple[str, tuple[int, ...]]] = {
    # partially observed CartPole: [cart position, pole angle]; the velocities are dropped
    "fnrl/CartPoleNoVel-v1": ("CartPole-v1", (0, 2)),
}
"""Env ids fnrl registers: id -> (base id, indices of the observation entries kept)."""


@lru_cache(maxsize=1)
def _envpool_ids() -> frozenset:
    import envpool

    return frozenset(envpool.list_all_envs())


def _is_atari(env_id: str) -> bool:
    import envpool

    return env_id in _envpool_ids() and "stack_num" in envpool.make_spec(env_id).config._fields


ENV_THREADS_VAR = "FNRL_ENV_THREADS"
"""Environment variable: EnvPool threads for every env fnrl makes (what `--env-threads` sets)."""
CHEAP_ENVPOOL_FAMILIES = ("envpool.classic_control", "envpool.toy_text")
"""EnvPool task families whose step costs well under a microsecond per env."""


def envpool_threads(env_id: str) -> int:
    """The `num_threads` fnrl gives EnvPool for `env_id` unless told otherwise.

    1 for classic-control and toy-text tasks, 0 (EnvPool's own default: one thread per
    core, at most one per env) for the rest. A CartPole step costs less than handing it to
    another thread and back, and EnvPool's worker threads spin while they wait, so extra
    threads only take CPU from the policy. Interleaved on 2 cores (`benchmarks/probes/threads.md`):
    raw CartPole 1.19-1.37x faster with 1 thread at 4 and 64 envs, a PPO rollout
    1.08-1.31x; Atari steps are heavy enough to gain from more threads (Pong, 8 envs:
    0.70-0.81x as fast with 1 thread). `$FNRL_ENV_THREADS` (`fnrl train --env-threads N`)
    overrides this for every env; `num_threads=` passed to `make` overrides both."""
    forced = os.environ.get(ENV_THREADS_VAR)
    if forced:
        if not forced.isdigit():
            raise ConfigError(f"${ENV_THREADS_VAR} must be a number of threads >= 0, got {forced!r}")
        return int(forced)
    return 1 if _envpool_family(env_id) in CHEAP_ENVPOOL_FAMILIES else 0


def _envpool_family(env_id: str) -> str | None:
    """EnvPool's task family of `env_id` (e.g. "envpool.classic_control"); None if EnvPool lacks it."""
    from envpool.registration import registry

    entry = registry.specs.get(env_id)
    return None if entry is None else entry[0]


IN_PROCESS_FAMILIES = ("envpool.classic_control",)
"""EnvPool task families that `make(backend="auto")` steps in-process (gymnasium) for few envs."""
IN_PROCESS_MAX_ENVS = 4
"""The most envs of such a task that `make(backend="auto")` steps in-process (`steps_in_process`)."""


def steps_in_process(env_id: str, num_envs: int, envpool_kwargs: dict) -> bool:
    """Whether `make(env_id, num_envs, backend="auto")` steps gymnasium's `env_id` in this thread
    (`InProcessEnvs`) instead of EnvPool's: for up to `IN_PROCESS_MAX_ENVS` envs of a
    classic-control task that gymnasium registers too (or an fnrl variant of one, `FNRL_ENVS`),
    unless EnvPool options were given (`num_threads=`, `$FNRL_ENV_THREADS`).

    A few cheap envs leave EnvPool little to batch, only the hand-off to its worker thread and
    back, which costs more than the steps: with 30-100 µs of the caller's work between steps
    (EnvPool's worker falls asleep meanwhile), a CartPole step of 1 / 4 envs costs 96-117 /
    131-210 µs through EnvPool and 27-38 / 72-85 µs in-process (Pendulum: 108-130 / 99-126 vs
    54-57 / 68-75 µs; `benchmarks/probes/env_step.md`, 2-core CPU in a slow phase), and a loaded
    machine makes the hand-off wait for the scheduler. PPO with CleanRL's 4-env CartPole
    settings trains 1.1-1.8x faster in-process (interleaved runs). From 8 envs on,
    EnvPool's batching wins. The dynamics, spaces and dtypes are the same; the random initial
    states differ."""
    env_id = _base_id(env_id)
    return (num_envs <= IN_PROCESS_MAX_ENVS and not envpool_kwargs and not os.environ.get(ENV_THREADS_VAR)
            and _envpool_family(env_id) in IN_PROCESS_FAMILIES and env_id in gym.registry)


def _base_id(env_id: str) -> str:
    """The env an fnrl variant (`FNRL_ENVS`) is built on; any other id itself."""
    return FNRL_ENVS[env_id][0] if env_id in FNRL_ENVS else env_id


def registered_id(env_id: str) -> str:
    """`env_id` with gymnasium's `module:Env-v0` form resolved: the module is imported (it registers
    the env, as `gymnasium.make` does for that form) and the id after the colon returned; any other
    id unchanged. A run keeps the whole string (its Config's `env_id`, in config.json), so every
    process that rebuilds the env (sampler workers, evaluation, `--resume`, `fnrl launch`, `fnrl
    eval`) imports the module too."""
    if ":" not in env_id:
        return env_id
    module, name = env_id.split(":", 1)
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"--env {env_id}: cannot import module {module!r} ({e}); put it on PYTHONPATH "
                          f"or install it") from None
    return name


def known(env_id: str) -> bool:
    """Whether `make` can build `env_id`: an EnvPool task, a registered gymnasium env (`module:Env-v0`
    after importing the module) or an fnrl variant of one (an env that only
    `fnrl.envs.functional` has is not)."""
    env_id = registered_id(env_id)
    return envpool_task(env_id) or _base_id(env_id) in gym.registry


def envpool_task(env_id: str) -> bool:
    """Whether EnvPool can step `env_id` (an fnrl variant of an EnvPool task included)."""
    return _base_id(env_id) in _envpool_ids()


def _space_spec(obs_space, act_space):
    if isinstance(obs_space, gym.spaces.Dict):
        obs_shape = {k: tuple(s.shape) for k, s in obs_space.spaces.items()}
        obs_dtype = {k: NUMPY_TO_TORCH[np.dtype(s.dtype)] for k, s in obs_space.spaces.items()}
    else:
        obs_shape, obs_dtype = tuple(obs_space.shape), NUMPY_TO_TORCH[np.dtype(obs_space.dtype)]
    if isinstance(act_space, gym.spaces.Discrete):
        return dict(obs_shape=obs_shape, obs_dtype=obs_dtype, action_shape=(), action_dtype=torch.int64,
                    num_actions=int(act_space.n))
    if isinstance(act_space, gym.spaces.Box):
        return dict(obs_shape=obs_shape, obs_dtype=obs_dtype, action_shape=tuple(act_space.shape),
                    action_dtype=torch.float32,
                    action_low=torch.as_tensor(act_space.low, dtype=torch.float32),
                    action_high=torch.as_tensor(act_space.high, dtype=torch.float32))
    if isinstance(act_space, (gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        if len(act_space.shape) != 1 or np.any(getattr(act_space, "start", 0) != 0):
            raise ConfigError(f"action space {act_space} is not supported: fnrl handles 1-d MultiDiscrete / "
                              "MultiBinary actions whose parts start at 0")
        nvec = (tuple(int(n) for n in act_space.nvec) if isinstance(act_space, gym.spaces.MultiDiscrete)
                else (2,) * int(act_space.shape[0]))
        return dict(obs_shape=obs_shape, obs_dtype=obs_dtype, action_shape=(len(nvec),), action_dtype=torch.int64,
                    action_nvec=nvec)
    raise ConfigError(f"action space {act_space} is not supported: fnrl handles Discrete, Box, MultiDiscrete and "
                      "MultiBinary actions")


def _unknown(env_id: str) -> ConfigError:
    known = sorted(set(_envpool_ids()) | set(gym.registry.keys()) | set(FNRL_ENVS))
    close = difflib.get_close_matches(env_id, known, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(
        f"unknown env id {env_id!r}: it is neither an EnvPool task nor a registered gymnasium env.{hint}"
    )


def make(env_id, num_envs: int = 1, seed: int | list[int] = 0, *, train: bool = True, backend: str = "auto",
         **kwargs) -> BatchedEnv:
    """Create `num_envs` copies of `env_id` stepped together.

    env_id: an EnvPool task, a registered gymnasium id, or gymnasium's `module:Env-v0`, which
        imports `module` first (where a user's env registers itself; `registered_id`); in
        Python also an env factory (`lambda: MyEnv(...)`, called `num_envs` times with `kwargs`
        and stepped in-process) or a gymnasium vector env with next-step autoreset (gymnasium's
        default; `num_envs` is its own). Training runs (`fnrl train`) take ids, which a run can
        keep in config.json.
    backend: "envpool" (C++ threads), "gymnasium" (any registered gymnasium id, e.g. a
        user's own env, stepped in this thread by `InProcessEnvs`), or "auto": EnvPool for
        every id it knows, except up to 4 classic-control envs, which are faster in-process
        (`steps_in_process`).
    train: for Atari, training envs use episodic life and reward clipping; evaluation envs
        (train=False) use neither. Episode statistics always report the raw game score.
    kwargs: passed to `envpool.make`, or to `gymnasium.make` for each env (`InProcessEnvs`).
        EnvPool's `num_threads` defaults to `envpool_threads(env_id)`: 1 for classic-control tasks.

    seed: one seed per env (a list of `num_envs` ints in [0, 2**31)), or an int s, which seeds
        env i with s + i. Training runs pass each env its own seed (`fnrl.rng.env_seeds`).

    The env remembers how it was made: `env.seeds` holds each env's seed and
    `env.factory(n, seeds)` builds n more such envs, so envs [lo, hi) of a pool are
    `env.factory(hi - lo, env.seeds[lo:hi])`.
    """
    if isinstance(env_id, gym.vector.VectorEnv):
        return _from_vector_env(env_id, seed)
    seeds = env_seed_list(seed, num_envs)
    if callable(env_id):
        env = _from_factory(env_id, num_envs, seeds, **kwargs)
        env.factory, env.seeds = functools.partial(make, env_id, **kwargs), seeds
        return env
    env = _make(registered_id(env_id), num_envs, seeds, train=train, backend=backend, **kwargs)
    env.factory, env.seeds = functools.partial(make, env_id, train=train, backend=backend, **kwargs), seeds
    return env


def _from_factory(factory, num_envs: int, seeds: list[int], **kwargs) -> BatchedEnv:
    """`num_envs` envs of `factory(**kwargs)`, stepped in this thread (`InProcessEnvs`)."""
    name = getattr(factory, "__name__", type(factory).__name__)
    with _env_kwargs_checked(name, kwargs):
        raw = InProcessEnvs(factory, num_envs, **kwargs)
    return BatchedEnv(raw, _spec_of(raw, raw.envs[0], name, num_envs), seed=seeds)


def _spec_of(batch, env, name: str, num_envs: int) -> EnvSpec:
    """The EnvSpec of a batch with gymnasium's `single_*_space`s; id and time limit from `env`'s
    gymnasium spec where it has one (else `name` and none)."""
    own = getattr(env, "spec", None)
    return EnvSpec(env_id=getattr(own, "id", None) or name, num_envs=num_envs,
                   max_episode_steps=getattr(own, "max_episode_steps", None),
                   **_space_spec(batch.single_observation_space, batch.single_action_space))


def _from_vector_env(vector, seed) -> BatchedEnv:
    """A gymnasium vector env as a batch (seeded at the first reset, as `make`'s envs are);
    channels-last images handed on channels-first (`ChannelsFirst`)."""
    mode = vector.metadata.get("autoreset_mode")
    if mode is not None and getattr(mode, "value", mode) != "NextStep":
        raise ConfigError(f"the vector env resets with autoreset mode {getattr(mode, 'value', mode)}; fnrl steps "
                          "next-step autoreset (gymnasium's default): make it with "
                          "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.NEXT_STEP}")
    seeds = env_seed_list(seed, vector.num_envs)
    batch = ChannelsFirst(vector) if channels_last(vector.single_observation_space) else vector
    env = BatchedEnv(batch, _spec_of(batch, vector, type(vector).__name__, vector.num_envs), seed=seeds)
    env.seeds = seeds
    return env


def env_seed_list(seed: int | list[int], num_envs: int) -> list[int]:
    """Each env's seed: `seed` itself for a list of `num_envs` seeds, s + i for an int s."""
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_envs:
        raise ConfigError(f"{len(seeds)} env seeds given for {num_envs} envs; give one seed per env")
    return seeds


def _make(env_id: str, num_envs: int, seed: list[int], *, train: bool, backend: str, **kwargs) -> BatchedEnv:
    if backend not in ("auto", "envpool", "gymnasium"):
        raise ConfigError(f"unknown env backend {backend!r}: use auto, envpool or gymnasium")
    if num_envs < 1:
        raise ConfigError(f"num_envs must be at least 1, got {num_envs}")
    if env_id in FNRL_ENVS:
        return _make_subset(env_id, num_envs, seed, train=train, backend=backend, **kwargs)
    if backend == "auto" and steps_in_process(env_id, num_envs, kwargs):
        backend = "gymnasium"
    if backend != "gymnasium" and env_id in _envpool_ids():
        if kwargs and backend == "auto" and env_id in gym.registry and _gymnasium_only(env_id, kwargs):
            return _make(env_id, num_envs, seed, train=train, backend="gymnasium", **kwargs)
        import envpool

        atari = _is_atari(env_id)
        if atari:
            kwargs.setdefault("episodic_life", train)
            kwargs.setdefault("reward_clip", train)
        kwargs.setdefault("num_threads", envpool_threads(env_id))
        with warnings.catch_warnings():   # EnvPool builds its Box spaces from float64 bounds: gymnasium
            warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
            with _env_kwargs_checked(env_id, kwargs):
                raw = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, **kwargs)
            cfg = raw.spec.config
            spec = EnvSpec(env_id=env_id, num_envs=num_envs, max_episode_steps=cfg.max_episode_steps,
                           is_atari=atari, **_space_spec(raw.observation_space, raw.action_space))
        return BatchedEnv(raw, spec, atari=atari)
    if backend != "envpool" and env_id in gym.registry:
        with _env_kwargs_checked(env_id, kwargs):
            raw = InProcessEnvs(env_id, num_envs, **kwargs)
        max_episode_steps = kwargs.get("max_episode_steps", gym.spec(env_id).max_episode_steps)
        spec = EnvSpec(env_id=env_id, num_envs=num_envs, max_episode_steps=max_episode_steps,
                       **_space_spec(raw.single_observation_space, raw.single_action_space))
        return BatchedEnv(raw, spec, seed=seed)
    raise _unknown(env_id)


def _gymnasium_only(env_id: str, kwargs: dict) -> bool:
    """Whether `kwargs` name an argument of gymnasium's `env_id` that EnvPool's version lacks
    (e.g. CartPole's `sutton_barto_reward`): then "auto" steps gymnasium's env in-process."""
    import inspect

    entry = gym.spec(env_id).entry_point
    try:
        cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
        accepted = set(inspect.signature(cls).parameters) | {"max_episode_steps", "render_mode"}
    except Exception:   # noqa: BLE001 - e.g. gymnasium's MuJoCo envs without mujoco: EnvPool's version then
        return False
    envpool_options = {"num_threads", "episodic_life", "reward_clip", "max_episode_steps", "render_mode"}
    return any(k in accepted and k not in envpool_options for k in kwargs)


@contextlib.contextmanager
def _env_kwargs_checked(env_id: str, kwargs: dict):
    """A constructor refusing one of `kwargs` (`--env-kwargs`) raises a TypeError naming it: one
    ConfigError line. Other errors pass unchanged."""
    try:
        yield
    except TypeError as e:
        if not any(f"'{key}'" in str(e) for key in kwargs):
            raise
        raise ConfigError(f"{env_id} refused its env kwargs ({e}); give --env-kwargs only arguments its "
                          "constructor takes") from None


def _make_subset(env_id: str, num_envs: int, seed: list[int], **kwargs) -> BatchedEnv:
    """A registered fnrl env: its base env with only some observation entries kept."""
    base_id, index = FNRL_ENVS[env_id]
    env = make(base_id, num_envs, seed, **kwargs)
    env._obs_index = np.asarray(index)
    env.spec = dataclasses.replace(env.spec, env_id=env_id, obs_shape=(len(index),))
    return env


def env_spec(env_id: str, num_envs: int = 1, **kwargs) -> EnvSpec:
    """The spec of `env_id` (creates and closes one batched env)."""
    env = make(env_id, num_envs=num_envs, **kwargs)
    spec = env.spec
    env.close()
    return spec
