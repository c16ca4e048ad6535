"""How a compiled run is sped up beyond `torch.compile`: `AccelOptions`, passed to the loops.

A training run takes them as `fnrl.train(..., accel=AccelOptions(...))`; left out, they are read
from the environment (`AccelOptions.from_environ`), so a probe or a user can turn one off
without touching code, e.g. `FNRL_AHEAD_OF_TIME=0 fnrl train dqn`. Every option changes how a
step runs, never what it computes. Why each is on by default, with its measurements:
docs/decisions.md.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from fnrl.errors import ConfigError

ENVIRON = {"ahead_of_time": "FNRL_AHEAD_OF_TIME", "skip_guards": "FNRL_SKIP_GUARDS",
           "fused_learner": "FNRL_FUSED_LEARNER"}
"""The environment variable that sets each option when none is passed ("0" / "false" / "no" / "off": off)."""

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class AccelOptions:
    """The speed options of a compiled run (all on by default; each applies only with compile=True).

    ahead_of_time: on the CPU, acting, the replay write, the fused off-policy learner step and a
        feed-forward PPO iteration run as AOTInductor models (`fnrl.accel.aot`) instead of
        `torch.compile`d functions, skipping TorchDynamo's guards and Python per call.
    skip_guards: once the serial loop is warm, TorchDynamo skips its guard checks
        (`fnrl.accel.compiled.steady`); a call that would need a new graph raises instead.
    fused_learner: off-policy runs draw the replay sample and update in one compiled graph, the
        state donated (`fnrl.learner`), for a row replay without frame deduplication and one seed.
    """

    ahead_of_time: bool = True
    skip_guards: bool = True
    fused_learner: bool = True

    @classmethod
    def from_environ(cls, environ=None) -> "AccelOptions":
        """The defaults, with each option whose variable (`ENVIRON`) is set in `environ`
        (default `os.environ`) taken from it; a value that is not a yes/no raises ConfigError."""
        environ = os.environ if environ is None else environ
        values = {}
        for field in fields(cls):
            raw = environ.get(ENVIRON[field.name])
            if raw is None or raw == "":
                continue
            word = raw.strip().lower()
            if word not in _OFF + _ON:
                raise ConfigError(f"${ENVIRON[field.name]} must be 0 or 1, got {raw!r}")
            values[field.name] = word in _ON
        return cls(**values)


def resolve(accel: AccelOptions | None) -> AccelOptions:
    """`accel`, or the options the environment sets (`AccelOptions.from_environ`) where it is None."""
    if accel is None:
        return AccelOptions.from_environ()
    if not isinstance(accel, AccelOptions):
        raise TypeError(f"accel must be an fnrl.accel.AccelOptions, got {type(accel).__name__}")
    return accel
