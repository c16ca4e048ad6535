"""The algorithms, by command-line name.

Each name maps to an algorithm module (which exposes `Config`, `validate`,
`make(config, env_spec) -> Agent` and `SPEC`, its `fnrl.algos.spec.AlgorithmSpec`) and a variant: a set of `Config` overrides that the
module publishes in its `VARIANTS` dict (e.g. `c51` is DQN with a categorical head).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from types import ModuleType

from fnrl.algos.spec import AlgorithmSpec, check_module
from fnrl.errors import ConfigError

ALGOS: dict[str, str] = {
    "ppo": "fnrl.algos.ppo",
    "a2c": "fnrl.algos.a2c",
    "dqn": "fnrl.algos.dqn",
    "c51": "fnrl.algos.dqn",
    "rainbow": "fnrl.algos.dqn",
    "qrdqn": "fnrl.algos.dqn",
    "iqn": "fnrl.algos.dqn",
    "ddpg": "fnrl.algos.qpg",
    "td3": "fnrl.algos.qpg",
    "sac": "fnrl.algos.qpg",
    "r2d1": "fnrl.algos.r2d1",
    "impala": "fnrl.algos.impala",
}


def available() -> list[str]:
    """Names whose module is present in this installation."""
    return [n for n, m in ALGOS.items() if importlib.util.find_spec(m) is not None]


def load(name: str) -> ModuleType:
    """The module of algorithm `name` (ConfigError if unknown), checked against the contract of
    `fnrl.algos.spec` (TypeError naming what it lacks)."""
    if name not in ALGOS or importlib.util.find_spec(ALGOS[name]) is None:
        raise ConfigError(f"unknown algorithm {name!r}; choose one of: {', '.join(available())}")
    module = importlib.import_module(ALGOS[name])
    check_module(name, module)
    return module


def spec(name: str) -> AlgorithmSpec:
    """The declared `AlgorithmSpec` of algorithm `name`."""
    return load(name).SPEC


def default_config(name: str):
    """The module's `Config` with the variant `name`'s overrides applied."""
    module = load(name)
    overrides = getattr(module, "VARIANTS", {}).get(name, {})
    return dataclasses.replace(module.Config(), **overrides)
