"""Samplers turn a policy's `act` and a batched env into [T, B] rollouts.

All produce the same rollout TensorDict (keys in fnrl.samplers.lane), chosen by name:

    sampler = make("parallel", env, agent.act, horizon=128, device="cpu", agent=("ppo", config), workers=4)
    rollout = sampler.collect(state)          # [T, B]
    sampler.close()

| name | what steps the envs | where the policy runs |
|---|---|---|
| serial | one EnvPool in this process | this process (`--device`): batched central inference |
| alternating | two EnvPools of B/2 envs, stepping while the policy acts for the other | this process |
| parallel | W worker processes with an EnvPool of B/W envs each | a CPU copy in each worker |
| graph | the env's dynamics in torch (`fnrl.envs.functional`), in one compiled scan with the policy | this process, in that scan |

A sampler is a class or function `(env, act, horizon, device, **options) -> sampler`
with `collect(state, explore=True) -> rollout` and `close()`; it owns `env`. To add one,
add its entry to `SAMPLERS` ("module:attribute", imported on first use).
"""
from __future__ import annotations

import importlib
import inspect

from fnrl.errors import ConfigError
from fnrl.samplers.serial import SerialSampler

SAMPLERS: dict[str, str] = {
    "serial": "fnrl.samplers.serial:SerialSampler",
    "alternating": "fnrl.samplers.alternating:AlternatingSampler",
    "parallel": "fnrl.samplers.parallel:ParallelSampler",
    "graph": "fnrl.samplers.graph:GraphSampler",
}


def available() -> list[str]:
    return list(SAMPLERS)


def load(name: str):
    """The sampler class (or factory) registered as `name`; ConfigError listing the choices if unknown."""
    if name not in SAMPLERS:
        raise ConfigError(f"unknown sampler {name!r}; choose one of: {', '.join([*SAMPLERS, 'async'])}")
    module, attr = SAMPLERS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def make(name: str, env, act, horizon: int, device="cpu", **options):
    """Build sampler `name` over `env` (a BatchedEnv from fnrl.envs.make, which it then owns).

    options: passed on where the sampler takes them (`agent=(algo name, config)`,
    `workers=W` for "parallel"); options a sampler does not take are dropped when None
    and a ConfigError otherwise.
    """
    cls = load(name)
    params = inspect.signature(cls).parameters
    taken = {k: v for k, v in options.items() if k in params}
    bad = [k for k, v in options.items() if k not in params and v is not None and k != "agent"]
    if bad:
        raise ConfigError(f"the {name} sampler takes no option {', '.join(bad)}")
    return cls(env, act, horizon, device, **taken)


__all__ = ["SerialSampler", "SAMPLERS", "available", "load", "make"]
