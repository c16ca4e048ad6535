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
| rest | wall time of the window minus the pieces: the loop's own Python, logging, checkpoints |

Writes nothing; prints a markdown table (share of wall time, µs per env step) and, with
`--cprofile`, the top functions of a cProfile of the same window.

    python benchmarks/offpolicy_profile.py dqn [--steps 6000] [--no-compile] [--check-guards] [--cprofile]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fnrl.train as train_mod  # noqa: E402
from fnrl import algos, replay  # noqa: E402
from fnrl.envs.batched import BatchedEnv  # noqa: E402
from fnrl.samplers.lane import Lane  # noqa: E402
from suite import CARTPOLE_DQN, HALFCHEETAH_SAC  # noqa: E402

SETTINGS = {"dqn": CARTPOLE_DQN, "sac": HALFCHEETAH_SAC, "td3": HALFCHEETAH_SAC}
PIECES = ("act", "env", "record", "replay add", "learn")


class Clock:
    """Per-piece time sums, counted only while `on`."""

    def __init__(self):
        self.on = False
        self.spent = dict.fromkeys(PIECES, 0.0)
        self.calls = dict.fromkeys(PIECES, 0)

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


def profile(algo: str, steps: int, compile: bool, use_cprofile: bool, warm_updates: int, learning_starts):
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

    make_agent, make_learner = train_mod._make_agent, train_mod._make_learner
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

    train_mod._make_agent, train_mod._make_learner = make_timed_agent, make_timed_learner
    BatchedEnv.step_arrays = clock.wrap("env", BatchedEnv.step_arrays)
    BatchedEnv.step_raw = clock.wrap("env", BatchedEnv.step_raw)
    Lane.record = clock.wrap("record", Lane.record)
    Lane.record_raw = clock.wrap("record", Lane.record_raw)
    Lane.finish = clock.wrap("record", Lane.finish)
    replay.add = clock.wrap("replay add", replay.add)
    replay.can_sample = clock.wrap("learn", replay.can_sample)
    with tempfile.TemporaryDirectory() as tmp:
        result = train_mod.train(algo, config, seed=1, log_dir=Path(tmp) / "run", compile=compile, quiet=True,
                                 tensorboard=False, plot=False, threads=1)
    wall = time.perf_counter() - window["t0"]
    if prof is not None:
        prof.disable()
    env_steps = int(result.state["env_steps"]) - window["steps0"]
    return clock, wall, env_steps, prof


def table(clock: Clock, wall: float, env_steps: int) -> str:
    rows = ["| piece | share of wall | µs per env step | calls |", "|---|---:|---:|---:|"]
    for piece in PIECES:
        s = clock.spent[piece]
        rows.append(f"| {piece} | {100 * s / wall:.1f}% | {1e6 * s / env_steps:,.0f} | {clock.calls[piece]:,} |")
    rest = wall - sum(clock.spent.values())
    rows.append(f"| rest | {100 * rest / wall:.1f}% | {1e6 * rest / env_steps:,.0f} | |")
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
    p.add_argument("--check-guards", action="store_true", help="keep Dynamo's guard checks (fnrl.train.SKIP_GUARDS)")
    args = p.parse_args()
    train_mod.SKIP_GUARDS = not args.check_guards
    load0 = os.getloadavg()
    clock, wall, steps, prof = profile(args.algo, args.steps, not args.no_compile, args.cprofile,
                                       args.warm_updates, args.learning_starts)
    load1 = os.getloadavg()
    print(f"{args.algo} compile={not args.no_compile} skip_guards={train_mod.SKIP_GUARDS}: {steps} env steps in the window, "
          f"load {load0[0]:.2f} -> {load1[0]:.2f}")
    print(table(clock, wall, steps))
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
