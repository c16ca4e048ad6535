"""Where an off-policy training step's wall time goes: `fnrl.train.train` itself, timed piece by piece.

Runs `train(ALGO, settings, compile=...)` with the settings of `benchmarks/suite.py`
(dqn: CARTPOLE_DQN, sac/td3: HALFCHEETAH_SAC) and, once the updates have started and the
first compiled calls are done, times every call of the loop's pieces with `perf_counter`:

| piece | what is timed |
|---|---|
| act | the agent's `act` (compiled where `compile`) as the sampler calls it |
| env | `BatchedEnv.step_raw` / `step_arrays` (the backend's step; `step_arrays` adds the numpy flags / episode statistics) |
| record | the sampler's writes of one step into the rollout (`Lane.record_raw` / `record`) and the flags / episode statistics of a collect (`Lane.finish`) |
| replay add | `replay.add` of the [T, B] rollout |
| learn | the loop's learner step (`fnrl.learner`: replay sample -> update -> priorities; one compiled graph under `compile`) and `replay.can_sample` |
| sampler | the rest of the sampler's `collect`: its loop over the steps, `Lane.act`'s and `Lane.begin`'s own Python |
| checkpoint | `fnrl.run.checkpoint.save_checkpoint` (the replay included): the window ends with the run's last checkpoint, which a short window holds once where the full run writes one every 10%, so it has its own row |
| rest | wall time of the window minus the pieces above: the training loop's own Python (counters, episode returns, the update cadence), logging and checkpoints at the cadence of the full run (`FULL_RUN`) |
| timers | this script's own wrappers around the timed calls (calibrated on a no-op, times the number of calls); subtracted from the rows whose time holds them |

Writes nothing; prints a markdown table (share of wall time, µs per env step) and, with
`--cprofile`, the top functions of a cProfile of the same window.

    python benchmarks/probes/offpolicy_profile.py dqn [--steps 6000] [--no-compile] [--check-guards] [--cprofile]

With --cprofile, PROFILE_SORT (default tottime) and PROFILE_TOP (default 30) choose the listing.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite

import fnrl.train as train_mod  # noqa: E402
from fnrl import algos, replay  # noqa: E402
from fnrl import learner as learner_steps  # noqa: E402
from fnrl.accel import AccelOptions, compiled  # noqa: E402
from fnrl.loops import serial  # noqa: E402
from fnrl.envs.batched import BatchedEnv  # noqa: E402
from fnrl.samplers.lane import Lane  # noqa: E402
from fnrl.samplers.serial import SerialSampler  # noqa: E402
from suite import CARTPOLE_DQN, HALFCHEETAH_SAC  # noqa: E402

SETTINGS = {"dqn": CARTPOLE_DQN, "sac": HALFCHEETAH_SAC, "td3": HALFCHEETAH_SAC}
FULL_RUN = {"dqn": 100_000, "sac": 1_000_000, "td3": 1_000_000}
"""Env steps of the full run (CleanRL's) whose logging and checkpoint cadence the window keeps:
`fnrl train`'s defaults for it, a log row every 1% of it and a checkpoint every 10%."""
PIECES = ("act", "env", "record", "replay add", "learn", "checkpoint")
INSIDE_COLLECT = ("act", "env", "record")


class Clock:
    """Per-piece time sums, counted only while `on`; "collect" spans act, env and record."""

    def __init__(self):
        self.on = False
        self.spent = dict.fromkeys((*PIECES, "collect"), 0.0)
        self.calls = dict.fromkeys((*PIECES, "collect"), 0)

    def wrap(self, piece: str, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.spent[piece] += time.perf_counter() - t
            self.calls[piece] += 1
            return out
        return timed


def timer_cost(calls: int = 200_000) -> float:
    """Seconds one `Clock.wrap`ped call adds to the call it times (a no-op timed against itself bare)."""
    def noop(*args):
        return None

    clock = Clock()
    clock.on = True
    timed = clock.wrap("act", noop)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls):
            timed(None)
        wrapped = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(calls):
            noop(None)
        best = min(best, (wrapped - (time.perf_counter() - t)) / calls)
    return best


def profile(algo: str, steps: int, compile: bool, use_cprofile: bool, warm_updates: int, learning_starts,
            skip_guards: bool = True):
    module = algos.load(algo)
    settings = dict(SETTINGS[algo])
    if learning_starts is not None:
        settings["learning_starts"] = learning_starts
    if algo == "td3":
        settings = {k: v for k, v in settings.items() if k not in ("alpha_lr", "autotune")}
    config = dataclasses.replace(algos.default_config(algo), **settings)
    config = dataclasses.replace(config, total_steps=config.learning_starts + steps)
    clock = Clock()
    prof = cProfile.Profile() if use_cprofile else None
    window = {}

    make_agent, make_learner = compiled.make_agent, learner_steps.make_learner
    updates = [0]

    def make_timed_agent(*args, **kwargs):
        agent = make_agent(*args, **kwargs)
        return agent._replace(act=clock.wrap("act", agent.act))

    def make_timed_learner(*args, **kwargs):
        timed_learn = clock.wrap("learn", make_learner(*args, **kwargs))

        def learn(state, buffer, beta):
            updates[0] += 1
            if updates[0] == warm_updates:   # the compiled calls are warm: open the window
                clock.on = True
                window["t0"], window["steps0"] = time.perf_counter(), int(state["env_steps"])
                if prof is not None:
                    prof.enable()
            return timed_learn(state, buffer, beta)

        return learn

    compiled.make_agent, learner_steps.make_learner = make_timed_agent, make_timed_learner
    BatchedEnv.step_arrays = clock.wrap("env", BatchedEnv.step_arrays)
    BatchedEnv.step_raw = clock.wrap("env", BatchedEnv.step_raw)
    Lane.record = clock.wrap("record", Lane.record)
    Lane.record_raw = clock.wrap("record", Lane.record_raw)
    Lane.finish = clock.wrap("record", Lane.finish)
    SerialSampler.collect = clock.wrap("collect", SerialSampler.collect)
    replay.add = clock.wrap("replay add", replay.add)
    replay.can_sample = clock.wrap("learn", replay.can_sample)
    serial.save_checkpoint = clock.wrap("checkpoint", serial.save_checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        result = train_mod.train(algo, config, seed=1, log_dir=Path(tmp) / "run", compile=compile, quiet=True,
                                 tensorboard=False, plot=False, threads=1, log_interval=FULL_RUN[algo] // 100,
                                 checkpoint_every=FULL_RUN[algo] // 10, accel=AccelOptions(skip_guards=skip_guards))
    wall = time.perf_counter() - window["t0"]
    if prof is not None:
        prof.disable()
    env_steps = int(result.state["env_steps"]) - window["steps0"]
    return clock, wall, env_steps, prof


def table(clock: Clock, wall: float, env_steps: int, per_call: float) -> str:
    """The pieces, the sampler's and the loop's own time, and the timers', each net of the timers."""
    inside = sum(clock.calls[p] for p in INSIDE_COLLECT)
    outside = clock.calls["collect"] + sum(clock.calls[p] for p in PIECES if p not in INSIDE_COLLECT)
    shares = {p: clock.spent[p] for p in PIECES}
    # a wrapper's own cost lies outside the time it records: in the collect's for the calls made
    # inside it, in the loop's for the others
    shares["sampler"] = clock.spent["collect"] - sum(clock.spent[p] for p in INSIDE_COLLECT) - per_call * inside
    shares["rest"] = wall - clock.spent["collect"] - sum(clock.spent[p] for p in PIECES if p not in INSIDE_COLLECT) \
        - per_call * outside
    shares["timers"] = per_call * (inside + outside)
    rows = ["| piece | share of wall | µs per env step | calls |", "|---|---:|---:|---:|"]
    for piece in ("act", "env", "record", "sampler", "replay add", "learn", "checkpoint", "rest", "timers"):
        calls = f"{clock.calls[piece]:,}" if piece in clock.calls else ""
        rows.append(f"| {piece} | {100 * shares[piece] / wall:.1f}% | {1e6 * shares[piece] / env_steps:,.1f} | {calls} |")
    rows.append(f"| **wall** | 100% | {1e6 * wall / env_steps:,.0f} | SPS {env_steps / wall:,.0f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("algo", choices=sorted(SETTINGS))
    p.add_argument("--steps", type=int, default=6000, help="env steps after learning_starts")
    p.add_argument("--learning-starts", type=int, default=None, help="override the suite's learning_starts")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--warm-updates", type=int, default=20, help="updates before the timed window opens")
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--check-guards", action="store_true", help="keep Dynamo's guard checks (fnrl.accel.AccelOptions.skip_guards)")
    args = p.parse_args()
    load0 = os.getloadavg()
    clock, wall, steps, prof = profile(args.algo, args.steps, not args.no_compile, args.cprofile,
                                       args.warm_updates, args.learning_starts, not args.check_guards)
    load1 = os.getloadavg()
    print(f"{args.algo} compile={not args.no_compile} skip_guards={not args.check_guards}: {steps} env steps in the window, "
          f"load {load0[0]:.2f} -> {load1[0]:.2f}")
    per_call = timer_cost()
    print(f"one timer: {per_call * 1e6:.2f} µs a call")
    print(table(clock, wall, steps, per_call))
    if prof is not None:
        pstats.Stats(prof).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(int(os.environ.get("PROFILE_TOP", "30")))


if __name__ == "__main__":
    main()
