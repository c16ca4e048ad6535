"""Tuned hyperparameters per (algorithm, env), kept as data: one TOML file per algorithm.

`fnrl/presets/ALGO.toml` holds one table per env id. Its keys are fields of the algorithm's
`Config`; `source` (required) says where the numbers come from (rl-baselines3-zoo's and
CleanRL's published settings where they exist, else how they were tuned, on which seeds), and
`notes` may explain a choice. A preset sets the run's budget (`total_steps`) too, so
`fnrl train ALGO --env ENV` trains for the budget its numbers were chosen for.

A run picks the preset of its algorithm and env automatically (`preset="auto"`) and says so
in one line; `preset="none"` (`--preset none`) keeps the `Config` defaults; options given
explicitly override the preset's values. `config.json` records the preset's name.

    config, name = configure("dqn", "CartPole-v1")            # the preset applied: name "dqn/CartPole-v1"
    config, name = configure("dqn", "CartPole-v1", preset="none", learning_rate=1e-3)   # name None
"""
from __future__ import annotations

import dataclasses
import functools
import tomllib
import typing
from pathlib import Path

from fnrl import algos
from fnrl.errors import ConfigError

FOLDER = Path(__file__).resolve().parent
CHOICES = ("auto", "none")
"""What `preset=` takes: "auto" (the env's preset, where one exists) or "none" (the defaults)."""
_INFO_KEYS = ("source", "notes")


@functools.lru_cache(maxsize=None)
def table(algo: str) -> dict[str, dict]:
    """env id -> the preset's entries (as written, `source` and `notes` included) for `algo`
    (an algorithm's command-line name); {} for an algorithm without a preset file."""
    path = FOLDER / f"{algo}.toml"
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"preset file {path} is not valid TOML ({e}); fix or remove it") from None
    config = algos.default_config(algo)
    fields = {f.name for f in dataclasses.fields(config)}
    for env_id, entries in data.items():
        unknown = sorted(set(entries) - fields - set(_INFO_KEYS))
        if unknown or "source" not in entries:
            raise ConfigError(f"preset {algo}/{env_id} in {path}: " + (
                f"{', '.join(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'} of "
                f"{algo}'s Config" if unknown else "it needs a `source` saying where its numbers come from"))
        if entries.get("env_id", env_id) != env_id:
            raise ConfigError(f"preset {algo}/{env_id} in {path} sets env_id {entries['env_id']!r}; drop it")
    return data


def settings(algo: str, env_id: str) -> dict | None:
    """The Config values of `algo`'s preset for `env_id` (None if it has none)."""
    entries = table(algo).get(env_id)
    if entries is None:
        return None
    hints = typing.get_type_hints(type(algos.default_config(algo)))
    return {k: _typed(hints[k], v) for k, v in entries.items() if k not in _INFO_KEYS}


def configure(algo: str, env_id: str | None = None, preset: str = "auto", **fields):
    """`(config, preset name or None)`: `algo`'s Config for `env_id` (default: the Config's
    own env), the env's preset applied unless `preset` is "none", then `fields` on top."""
    if preset not in CHOICES:
        raise ConfigError(f"--preset must be one of {', '.join(CHOICES)}, got {preset!r}")
    config = algos.default_config(algo)
    env_id = env_id or fields.pop("env_id", None) or config.env_id
    values = settings(algo, env_id) if preset == "auto" else None
    name = f"{algo}/{env_id}" if values is not None else None
    try:
        config = dataclasses.replace(config, **{**(values or {}), "env_id": env_id, **fields})
    except TypeError as e:
        raise ConfigError(f"{algo}: {e}") from None
    return config, name


def describe(name: str) -> str:
    """One line naming preset `name` ("algo/env") and its source."""
    algo, env_id = name.split("/", 1)
    return f"preset {name} ({table(algo)[env_id]['source']}); --preset none for the defaults"


def _typed(kind, value):
    """A TOML value as the Config field's type: arrays become tuples, ints become floats for floats."""
    if typing.get_origin(kind) is tuple:
        return tuple(value)
    base = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
    return float(value) if base[0] is float and isinstance(value, int) else value
