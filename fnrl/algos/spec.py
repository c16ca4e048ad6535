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
MAKE_OPTIONS = {"compile": ("compile", "ahead_of_time"), "batched": ("batched",)}
"""The keyword options an algorithm's `make` may declare, with the parameters each one means."""


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
    make_options: what `make(config, env_spec, ...)` takes beyond its two arguments:
        "compile": it compiles the pieces its update sequences itself (`compile=`, and
        `ahead_of_time=` for whether they may run as one AOTInductor model; `fnrl.accel.staged`),
        so `fnrl.accel.compiled.make_agent` does not compile its update; "batched": with
        `batched=True` its update trains K stacked rows, vmapped piece by piece (`fnrl.seeds`).
    """

    kind: str
    runtime: str = "serial"
    replay: str | None = None
    act_keys: tuple | None = None
    sweepable: tuple[str, ...] = ()
    make_options: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, got {self.runtime!r}")
        if self.replay not in REPLAYS or (self.replay is None) != (self.kind == "on_policy"):
            raise ValueError(f"replay is 'row' or 'sequence' for off-policy algorithms and None for on-policy "
                             f"ones, got {self.replay!r} for {self.kind}")
        unknown = [o for o in self.make_options if o not in MAKE_OPTIONS]
        if unknown:
            raise ValueError(f"make_options may hold {', '.join(MAKE_OPTIONS)}, got {', '.join(unknown)}")

    @property
    def off_policy(self) -> bool:
        return self.kind == "off_policy"


def check_module(name: str, module) -> None:
    """TypeError naming what algorithm module `module` (registered as `name`) lacks of the contract."""
    import dataclasses
    import inspect

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
    params = inspect.signature(module.make).parameters
    missing = [p for o in spec.make_options for p in MAKE_OPTIONS[o] if p not in params]
    if missing:
        raise TypeError(f"algorithm {name!r} declares make_options {spec.make_options} but its make() takes no "
                        f"{', '.join(missing)}")
