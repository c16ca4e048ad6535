"""The contract between an algorithm module and the training loops: its declared `SPEC`.

An algorithm module exposes `Config` (a dataclass), `validate(config, spec=None)`,
`make(config, env_spec) -> Agent` and `SPEC = AlgorithmSpec(...)`, which tells the loops how
to run it; `fnrl.algos.load` checks all of it when it loads the module.
"""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("on_policy", "off_policy")
RUNTIMES = ("serial", "central")
REPLAYS = (None, "row", "sequence")


@dataclass(frozen=True)
class AlgorithmSpec:
    """How the training loops run an algorithm.

    kind: "on_policy" (collect [T, B] -> update(state, rollout)) or "off_policy" (collect ->
        replay -> updates on replay samples).
    runtime: "serial" (`fnrl.loops.serial`, also `--sampler async` for off-policy ones) or
        "central" (actor processes with central inference, `fnrl.train_central`).
    replay: off-policy only: "row" (`fnrl.replay`: transitions with n-step targets) or
        "sequence" (`fnrl.replay.sequence`: stored recurrent sequences; the module then has
        `sequence_input(config, rollout)`).
    act_keys: the state entries `act` reads (nested keys as tuples; `env_steps` included), so a
        compiled `act` is given only those (`fnrl.accel.compiled.acting_on`); None: the whole state.
    sweepable: the Config fields that rows of one vmapped run may vary (`--sweep FIELD=...`): their
        values live in the state, so one compiled update serves every row. An on-policy algorithm
        that declares none cannot be vmapped.
    """

    kind: str
    runtime: str = "serial"
    replay: str | None = None
    act_keys: tuple | None = None
    sweepable: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.replay not in REPLAYS or (self.replay is None) != (self.kind == "on_policy"):
            raise ValueError(f"replay is 'row' or 'sequence' for off-policy algorithms and None for on-policy "
                             f"ones, got {self.replay!r} for {self.kind}")

    @property
    def off_policy(self) -> bool:
        return self.kind == "off_policy"


def check_module(name: str, module) -> None:
    """TypeError naming what algorithm module `module` (registered as `name`) lacks of the contract."""
    import dataclasses

    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"algorithm {name!r} ({module.__name__}) declares no SPEC = AlgorithmSpec(...)")
    for attr in ("make", "validate"):
        if not callable(getattr(module, attr, None)):
            raise TypeError(f"algorithm {name!r} ({module.__name__}) has no {attr}()")
    config = getattr(module, "Config", None)
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"algorithm {name!r} ({module.__name__}) has no Config dataclass")
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = [f for f in spec.sweepable if f not in fields]
    if unknown:
        raise TypeError(f"algorithm {name!r} declares sweepable fields that its Config lacks: {', '.join(unknown)}")
