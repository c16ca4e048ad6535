"""`fnrl check-env ID`: does an env meet what fnrl's training loops rely on?

    for check in check_env("mypkg.envs:Corridor-v0", {"length": 7}):
        print(check.ok, check.name, check.detail)

The checks, each a `Check(name, ok, detail)`:

- made: `fnrl.envs.make` builds a batch of the env (an EnvPool task, a registered gymnasium id
  or gymnasium's `module:Env-v0`, with the env kwargs): Discrete, Box, MultiDiscrete or
  MultiBinary actions, Box or Dict observations.
- gymnasium: for a gymnasium env, `gymnasium.utils.env_checker.check_env` (the reset / step
  contract, spaces, seeding) passes, its warnings reported in the detail.
- observations: over `steps` steps of random actions, every observation has the spec's shape
  and dtype, is finite, and lies in the observation space's bounds.
- rewards: every reward is finite.
- episodes: an episode ends within `steps` steps, or the env has a time limit
  (`max_episode_steps`); an env that never ends never reports a return.
- determinism: two batches made with the same seeds and given the same actions step alike
  (observations, rewards, ends): the condition for runs that repeat under a seed.
"""
from __future__ import annotations

import re
import warnings
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str


def check_env(env_id: str, env_kwargs: dict | None = None, steps: int = 500, seed: int = 0) -> list[Check]:
    """Run the checks of the module docstring on 2 envs of `env_id`; ConfigError if it cannot be made."""
    from fnrl import envs

    kwargs = dict(env_kwargs or {})
    env = envs.make(env_id, 2, seed=[seed, seed + 1], **kwargs)   # ConfigError: unknown id, bad kwargs
    spec = env.spec
    try:
        checks = [Check("made", True, _describe(spec))]
        gym_id = envs.registered_id(env_id)
        if gym_id in gym.registry and gym_id not in envs.FNRL_ENVS:
            checks.append(_gymnasium(gym_id, kwargs))
        trace = _trace(env, steps, seed)
    finally:
        env.close()
    checks += [_observations(trace, spec, env), _rewards(trace), _episodes(trace, spec, steps)]
    again = envs.make(env_id, 2, seed=[seed, seed + 1], **kwargs)
    try:
        checks.append(_determinism(trace, _trace(again, steps, seed, actions=trace["actions"])))
    finally:
        again.close()
    return checks


def _describe(spec) -> str:
    if spec.discrete:
        action = f"Discrete({spec.num_actions})"
    elif spec.multi_discrete:
        action = f"MultiDiscrete({list(spec.action_nvec)})"
    else:
        action = f"Box{tuple(spec.action_shape)} in [{spec.action_low.min():.3g}, {spec.action_high.max():.3g}]"
    return f"observations {spec.obs_shape} {spec.obs_dtype}, actions {action}"


def _gymnasium(gym_id: str, kwargs: dict) -> Check:
    from gymnasium.utils.env_checker import check_env as gymnasium_check

    try:
        single = gym.make(gym_id, **kwargs)
    except Exception as e:   # noqa: BLE001 - e.g. kwargs only EnvPool's version of the env takes
        return Check("gymnasium", False, f"gymnasium cannot make {gym_id}: {type(e).__name__}: {e}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check(single.unwrapped, skip_render_check=True)
    except Exception as e:   # noqa: BLE001 - any failure of gymnasium's checker is the finding
        return Check("gymnasium", False, f"{type(e).__name__}: {e}")
    finally:
        single.close()
    notes = sorted({re.sub(r"\x1b\[[0-9;]*m|^WARN: ", "", str(w.message).split("\n")[0]) for w in caught})
    return Check("gymnasium", True, "env_checker passed" + (f"; warnings: {' | '.join(notes)}" if notes else ""))


def _trace(env, steps: int, seed: int, actions: list | None = None) -> dict:
    """`steps` steps of the batch under random actions (or `actions`): what each step returned."""
    generator = torch.Generator().manual_seed(seed)
    spec = env.spec
    out = {"obs": [env.reset()["obs"]], "reward": [], "done": [], "actions": []}
    for t in range(steps):
        if actions is not None:
            action = actions[t]
        elif spec.discrete:
            action = torch.randint(spec.num_actions, (spec.num_envs,), generator=generator)
        elif spec.multi_discrete:
            u = torch.rand((spec.num_envs, len(spec.action_nvec)), generator=generator)
            action = (u * torch.tensor(spec.action_nvec)).long()
        else:
            u = torch.rand((spec.num_envs, *spec.action_shape), generator=generator)
            low, high = spec.action_low.clamp(min=-1e3), spec.action_high.clamp(max=1e3)
            action = low + u * (high - low)
        step = env.step(action)
        out["actions"].append(action)
        for key in ("obs", "reward", "done"):
            out[key].append(step[key])
    return out


def _observations(trace: dict, spec, env) -> Check:
    space = getattr(env.raw, "single_observation_space", None) or env.raw.observation_space   # EnvPool: one env's
    for t, obs in enumerate(trace["obs"]):
        parts = obs.items() if not torch.is_tensor(obs) else [(None, obs)]
        for key, x in parts:
            shape = spec.obs_shape[key] if key is not None else spec.obs_shape
            dtype = spec.obs_dtype[key] if key is not None else spec.obs_dtype
            where = f"at step {t}" + (f", key {key!r}" if key is not None else "")
            if tuple(x.shape[1:]) != tuple(shape) or x.dtype != dtype:
                return Check("observations", False, f"{where}: {tuple(x.shape[1:])} {x.dtype}, the space says "
                                                    f"{tuple(shape)} {dtype}")
            if x.is_floating_point() and not torch.isfinite(x).all():
                return Check("observations", False, f"{where}: not finite ({x.flatten()[:8].tolist()})")
            box = space[key] if key is not None and space is not None else space
            if (isinstance(box, gym.spaces.Box) and tuple(box.shape) == tuple(shape)   # a variant keeps fewer entries
                    and not _within(x.numpy(), box)):
                return Check("observations", False, f"{where}: outside the observation space's bounds "
                                                    f"[{box.low.min():.3g}, {box.high.max():.3g}]")
    return Check("observations", True, f"{len(trace['obs'])} batches of the spec's shape and dtype, finite, "
                                       "in bounds")


def _within(x: np.ndarray, box) -> bool:
    return bool(np.all(x >= box.low) and np.all(x <= box.high))


def _rewards(trace: dict) -> Check:
    rewards = torch.stack(trace["reward"])
    if not torch.isfinite(rewards).all():
        return Check("rewards", False, f"not finite at step {int((~torch.isfinite(rewards)).any(1).nonzero()[0])}")
    return Check("rewards", True, f"finite, in [{rewards.min():.3g}, {rewards.max():.3g}]")


def _episodes(trace: dict, spec, steps: int) -> Check:
    ended = int(torch.stack(trace["done"]).sum())
    if ended:
        return Check("episodes", True, f"{ended} ended in {steps} steps of 2 envs")
    if spec.max_episode_steps:
        return Check("episodes", True, f"none ended in {steps} steps; the time limit is {spec.max_episode_steps}")
    return Check("episodes", False, f"none ended in {steps} steps and the env has no time limit: register it with "
                                    "max_episode_steps (or pass it in --env-kwargs)")


def _determinism(first: dict, second: dict) -> Check:
    for key in ("obs", "reward", "done"):
        for t, (a, b) in enumerate(zip(first[key], second[key])):
            same = (all(torch.equal(a[k], b[k]) for k in a.keys()) if not torch.is_tensor(a)
                    else torch.equal(a, b))
            if not same:
                return Check("determinism", False, f"two batches made with the same seeds differ in {key} at step "
                                                   f"{t}: seed the env's randomness from reset(seed=...)")
    return Check("determinism", True, "the same seeds and actions give the same steps")


def report(checks: list[Check]) -> str:
    """One line per check: `ok` or `FAIL`, its name and detail."""
    return "\n".join(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in checks)

