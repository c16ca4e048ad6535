"""The off-policy learner step: sampled and updated separately, fused into one compiled graph, and
that graph ahead of time.

Two measurements, each interleaved in one process (rounds of A, B, C; a ratio is the median of
the per-round ratios, so a change of the host's speed between rounds cancels):

1. per update, on a filled buffer: `separate` = `replay.can_sample` + `replay.sample(compiled=True)`
   + the `torch.compile`d update (fnrl.train with AccelOptions(fused_learner=False)), `fused` = the
   `fnrl.learner` step through `torch.compile` (sample -> update -> priorities as one graph,
   state donated, cpp_wrapper) + `replay.can_sample`, `ahead of time` = the same step as an
   AOTInductor model called with the flat leaves (`make_learner(..., ahead_of_time=True)`);
2. (dqn only) whole `fnrl.train` runs with the fused learner step and the replay writes
   (`replay.add(compiled=True)`) through `torch.compile`, and both ahead of time (the loop's
   default): env steps per second after learning starts (updates included).

Settings: benchmarks/suite.py's CARTPOLE_DQN (CleanRL dqn.py: batch 128, 120x84, an update
every 10 env steps) and HALFCHEETAH_SAC (batch 256, 256x256). Writes a markdown table to stdout.

    python benchmarks/probes/learner_step.py [--algos dqn,sac] [--rounds 5] [--train-rounds 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite

import torch  # noqa: E402

import fnrl.learner as learner_mod  # noqa: E402
import fnrl.train as train_mod  # noqa: E402
from fnrl.loops.off_policy import init_replay  # noqa: E402
from fnrl import algos, envs, replay, samplers  # noqa: E402
from fnrl.learner import make_learner  # noqa: E402
from suite import CARTPOLE_DQN, HALFCHEETAH_SAC, machine  # noqa: E402

SETTINGS = {"dqn": CARTPOLE_DQN, "sac": HALFCHEETAH_SAC}


def filled_buffer(algo: str, config, fill: int):
    """The agent (eager) and a buffer holding `fill` env steps of its exploring policy."""
    module = algos.load(algo)
    env = envs.make(config.env_id, config.num_envs, seed=0)
    agent = module.make(config, env.spec)
    state = agent.init(0)
    sampler = samplers.make("serial", env, agent.act, config.num_steps)
    buffer = None
    for _ in range(fill // (config.num_steps * config.num_envs)):
        rollout = sampler.collect(state)
        buffer = buffer or init_replay(config, rollout, env.spec, "cpu")
        buffer = replay.add(buffer, rollout, compiled=True)
    sampler.close()
    return agent, state, buffer


def per_update(algo: str, rounds: int, calls: int) -> dict:
    config = dataclasses.replace(algos.default_config(algo), **SETTINGS[algo])
    agent, state, buffer = filled_buffer(algo, config, 5_000)
    compiled_update = torch.compile(agent.update, fullgraph=True, dynamic=False)
    ways = {
        "separate": make_learner(compiled_update, config.batch_size, config.prioritized, fused=False,
                                 sample_options={"compiled": True}),
        "fused": make_learner(agent.update, config.batch_size, config.prioritized, fused=True),
        "ahead of time": make_learner(agent.update, config.batch_size, config.prioritized, fused=True,
                                      ahead_of_time=True),
    }
    states = {name: state.clone() for name in ways}

    def run(name: str, n: int) -> float:
        learn, s = ways[name], states[name]
        t = time.perf_counter()
        for _ in range(n):
            replay.can_sample(buffer, config.batch_size)
            s, _, _ = learn(s, buffer, 0.4)
        states[name] = s
        return (time.perf_counter() - t) / n

    for name in ways:   # compile and warm, outside the guard-skipping stance
        run(name, 3)
    times = {name: [] for name in ways}
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        for _ in range(rounds):
            for name in ways:
                times[name].append(run(name, calls))

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        r = [x / y for x, y in zip(times[a], times[b])]
        return statistics.median(r), min(r), max(r)

    return {"us": {name: 1e6 * statistics.median(t) for name, t in times.items()},
            "separate / fused": ratio("separate", "fused"), "fused / ahead of time": ratio("fused", "ahead of time")}


def train_sps(ahead_of_time: bool, steps: int) -> float:
    """Env steps/s of a DQN run with its learner step and replay writes ahead of time or not."""
    config = dataclasses.replace(algos.default_config("dqn"), **CARTPOLE_DQN)
    config = dataclasses.replace(config, total_steps=config.learning_starts + steps)
    make, add = learner_mod.make_learner, replay.add
    learner_mod.make_learner = functools.partial(_learner_with, make, ahead_of_time)
    replay.add = functools.partial(_add_with, add, ahead_of_time)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = train_mod.train("dqn", config, seed=1, log_dir=Path(tmp) / "run", compile=True, quiet=True,
                                     tensorboard=False, plot=False, threads=1, log_interval=1_000)
    finally:
        learner_mod.make_learner, replay.add = make, add
    rows = result.history
    start = next(r for r in rows if r["env_steps"] >= config.learning_starts + 2_000)
    return (rows[-1]["env_steps"] - start["env_steps"]) / (rows[-1]["wall_s"] - start["wall_s"])


def _learner_with(make, aot_step: bool, *args, **kwargs):
    return make(*args, **{**kwargs, "ahead_of_time": aot_step and kwargs.get("fused", False)})


def _add_with(add, aot_write: bool, *args, **kwargs):
    return add(*args, **{**kwargs, "ahead_of_time": aot_write})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="dqn,sac")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300, help="updates per timed round")
    p.add_argument("--train-rounds", type=int, default=3, help="rounds of whole DQN runs (0: skip)")
    p.add_argument("--train-steps", type=int, default=20_000, help="env steps after learning_starts per run")
    args = p.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    print(f"Machine: {machine(1)}\n")
    print("| algo (settings) | separate µs / update | fused µs / update | ahead of time µs / update | "
          "separate / fused (median, range) | fused / ahead of time (median, range) |")
    print("|---|---:|---:|---:|---|---|")
    for algo in args.algos.split(","):
        r = per_update(algo, args.rounds, args.calls)
        us = r["us"]
        cells = [f"{x[0]:.2f}x ({x[1]:.2f}-{x[2]:.2f})" for x in (r["separate / fused"], r["fused / ahead of time"])]
        print(f"| {algo} | {us['separate']:,.0f} | {us['fused']:,.0f} | {us['ahead of time']:,.0f} | "
              f"{cells[0]} | {cells[1]} |", flush=True)
    if args.train_rounds:
        sps = {False: [], True: []}
        for _ in range(args.train_rounds):
            for ahead in (False, True):
                sps[ahead].append(train_sps(ahead, args.train_steps))
        ratios = [a / c for c, a in zip(sps[False], sps[True])]
        print("\n| DQN CartPole `fnrl.train` (CleanRL settings) | learner + replay writes torch.compile SPS | "
              "ahead of time SPS | ahead of time / torch.compile |")
        print("|---|---|---|---|")
        for i, (c, a) in enumerate(zip(sps[False], sps[True])):
            print(f"| round {i + 1} | {c:,.0f} | {a:,.0f} | {a / c:.2f}x |")
        print(f"| **median** | {statistics.median(sps[False]):,.0f} | {statistics.median(sps[True]):,.0f} | "
              f"**{statistics.median(ratios):.2f}x** |")
    print(f"\nLoad average {load0:.2f} -> {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
