"""The off-policy learner step fused into one compiled graph vs sampled and updated separately.

Two measurements, each interleaved in one process (rounds of A then B; the ratio is the median
of the per-round ratios, so a change of the host's speed between rounds cancels):

1. per update, on a filled buffer: `separate` = `replay.can_sample` + `replay.sample(compiled=True)`
   + the `torch.compile`d update (fnrl.train with FUSED_LEARNER = False), `fused` = the
   `fnrl.learner` step (sample -> update -> priorities as one graph, state donated,
   cpp_wrapper) + `replay.can_sample`;
2. (dqn only) whole `fnrl.train` runs with `fnrl.train.FUSED_LEARNER` False / True: env steps
   per second after learning starts (updates included).

Settings: benchmarks/suite.py's CARTPOLE_DQN (CleanRL dqn.py: batch 128, 120x84, an update
every 10 env steps) and HALFCHEETAH_SAC (batch 256, 256x256). Writes a markdown table to stdout.

    python benchmarks/learner_step.py [--algos dqn,sac] [--rounds 5] [--train-rounds 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import fnrl.train as train_mod  # noqa: E402
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
        buffer = buffer or train_mod._init_replay(config, rollout, env.spec, "cpu")
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
    ratios = [s / f for s, f in zip(times["separate"], times["fused"])]
    return {"separate_us": 1e6 * statistics.median(times["separate"]),
            "fused_us": 1e6 * statistics.median(times["fused"]), "speedup": statistics.median(ratios),
            "spread": (min(ratios), max(ratios))}


def train_sps(fused: bool, steps: int) -> float:
    train_mod.FUSED_LEARNER = fused
    config = dataclasses.replace(algos.default_config("dqn"), **CARTPOLE_DQN)
    config = dataclasses.replace(config, total_steps=config.learning_starts + steps)
    with tempfile.TemporaryDirectory() as tmp:
        result = train_mod.train("dqn", config, seed=1, log_dir=Path(tmp) / "run", compile=True, quiet=True,
                                 tensorboard=False, plot=False, threads=1, log_interval=1_000)
    rows = result.history
    start = next(r for r in rows if r["env_steps"] >= config.learning_starts + 2_000)
    return (rows[-1]["env_steps"] - start["env_steps"]) / (rows[-1]["wall_s"] - start["wall_s"])


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
    print("| algo (settings) | separate µs / update | fused µs / update | separate / fused (median, range) |")
    print("|---|---:|---:|---|")
    for algo in args.algos.split(","):
        r = per_update(algo, args.rounds, args.calls)
        print(f"| {algo} | {r['separate_us']:,.0f} | {r['fused_us']:,.0f} | {r['speedup']:.2f}x "
              f"({r['spread'][0]:.2f}-{r['spread'][1]:.2f}) |", flush=True)
    if args.train_rounds:
        sps = {False: [], True: []}
        for _ in range(args.train_rounds):
            for fused in (False, True):
                sps[fused].append(train_sps(fused, args.train_steps))
        ratios = [f / s for s, f in zip(sps[False], sps[True])]
        print("\n| DQN CartPole `fnrl.train` (CleanRL settings) | separate SPS | fused SPS | fused / separate |")
        print("|---|---|---|---|")
        for i, (s, f) in enumerate(zip(sps[False], sps[True])):
            print(f"| round {i + 1} | {s:,.0f} | {f:,.0f} | {f / s:.2f}x |")
        print(f"| **median** | {statistics.median(sps[False]):,.0f} | {statistics.median(sps[True]):,.0f} | "
              f"**{statistics.median(ratios):.2f}x** |")
    print(f"\nLoad average {load0:.2f} -> {os.getloadavg()[0]:.2f}.")


if __name__ == "__main__":
    main()
