"""Steady PPO CartPole-v1 env steps per second: fnrl's graph sampler against purejaxrl, in turns.

Both on purejaxrl's `ppo.py` settings, CleanRL's (B envs x 128 steps, 4 epochs x 4 minibatches,
lr 2.5e-4 annealed, 64-64 tanh), at B = 4 and 64, for `--steps` env steps (2M by default):

- fnrl: the benchmark suite's compiled contender on `ppo-cartpole-B-graph` (`--sampler graph`:
  the rollout, with the env, one compiled call) and on `ppo-cartpole-B` (the default path: EnvPool
  stepped from the serial sampler), each in its own process with `--threads` torch threads (1, as
  `fnrl train`; the update takes every core where `fnrl.run.threads.update_threads_for` says so);
  steady = env steps over wall time in the second half of the run;
- purejaxrl: its `make_train(config)` jitted, called once (jit included), then timed on a second
  call with another key: steady = steps / that call's seconds (its whole training is one call).

Rounds alternate the contenders' order. Writes the table on top of the earlier runs in purejaxrl_steady.md.

`--breakdown B` times, instead, where fnrl's graph-sampler iteration at B envs goes (in a worker
process, over the second half of the run): the compiled rollout (`GraphSampler.collect`), the
update (`agent.update`: the minibatch order drawn on the host, then the compiled GAE and
minibatch steps) and the rest of the loop's Python; medians per iteration.

    python benchmarks/probes/purejaxrl_steady.py --purejaxrl DIR --jax-python PY [--rounds 3] [--envs 4,64]
    python benchmarks/probes/purejaxrl_steady.py --breakdown 4 [--steps 1000000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent / "suite.py"
OUTPUT = Path(__file__).with_suffix(".md")

sys.path.insert(0, str(HERE.parent))   # benchmarks/: machine
sys.path.insert(0, str(HERE))          # probes/: the purejaxrl patch of time_to_solve
from machine import cpu_model, in_turns, prepend_report  # noqa: E402
from time_to_solve import PUREJAXRL_SETUP  # noqa: E402

PUREJAXRL_STEADY = PUREJAXRL_SETUP + r'''
envs, steps = int(sys.argv[2]), int(sys.argv[3])
config = {"LR": 2.5e-4, "NUM_ENVS": envs, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": steps, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
          "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
train = jax.jit(make_train(config))
jax.block_until_ready(train(jax.random.PRNGKey(0)))
t1 = time.perf_counter()
jax.block_until_ready(train(jax.random.PRNGKey(1)))
print(f"RESULT sps={steps / (time.perf_counter() - t1):.1f}")
'''


def fnrl_sps(envs: int, steps: int, threads: int, graph: bool = True) -> float:
    workload = f"ppo-cartpole-{envs}-graph" if graph else f"ppo-cartpole-{envs}"
    out = subprocess.run([sys.executable, str(SUITE), "--worker", "compiled", workload,
                          str(steps), str(threads)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"fnrl {envs} envs failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["sps"]


def breakdown_worker(envs: int, steps: int, threads: int) -> dict:
    """fnrl's graph-sampler run at `envs` envs in this process with timers around the rollout and the
    update: medians (ms) over the second half's iterations."""
    import torch

    from fnrl.loops import serial
    from fnrl.samplers import graph

    torch.set_num_threads(threads)
    starts, collects, updates = [], [], []
    collect, make = graph.GraphSampler.collect, serial.env_and_agent

    def timed_collect(self, state, explore=True):
        starts.append(time.perf_counter())
        out = collect(self, state, explore)
        collects.append(time.perf_counter() - starts[-1])
        return out

    def timed_update(update):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = update(*args, **kwargs)
            updates.append(time.perf_counter() - t0)
            return out
        return run

    def env_and_agent(plan, world):
        env, agent, fused = make(plan, world)
        return env, agent._replace(update=timed_update(agent.update)), fused

    graph.GraphSampler.collect, serial.env_and_agent = timed_collect, env_and_agent
    sys.path.insert(0, str(SUITE.parent))
    import suite

    suite.run_fnrl(suite.BY_KEY[f"ppo-cartpole-{envs}-graph"], steps, compile=True, threads=threads)
    half = len(updates) // 2
    iterations = [b - a for a, b in zip(starts[half:], starts[half + 1:])]
    ms = {name: 1e3 * statistics.median(xs[half:half + len(iterations)])
          for name, xs in (("rollout", collects), ("update", updates))}
    ms["iteration"] = 1e3 * statistics.median(iterations)
    ms["rest"] = ms["iteration"] - ms["rollout"] - ms["update"]
    return ms


def breakdown(envs: int, steps: int, threads: int) -> str:
    out = subprocess.run([sys.executable, __file__, "--breakdown-worker", str(envs), str(steps), str(threads)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"breakdown failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    ms = json.loads(out.stdout.strip().splitlines()[-1])
    steps_per_iteration = envs * 128
    lines = [f"# Where fnrl's graph-sampler PPO iteration goes, {envs} envs x 128 steps", "",
             f"Machine: {cpu_model()}; {threads} torch thread(s); {steps:,} env steps, medians over the second "
             "half's iterations (`--breakdown`).", "",
             "| part | ms per iteration | per |", "|---|---:|---|",
             f"| compiled rollout (env, act, bookkeeping) | {ms['rollout']:.2f} | "
             f"{1e3 * ms['rollout'] / 128:.1f} µs per step of {envs} envs |",
             f"| update (minibatch order on the host, compiled GAE and 16 minibatch steps) | {ms['update']:.2f} | "
             f"at most {1e3 * ms['update'] / 16:.0f} µs per minibatch step |",
             f"| the loop's Python between them | {ms['rest']:.2f} | |",
             f"| whole iteration | {ms['iteration']:.2f} | {steps_per_iteration / ms['iteration'] * 1e3:,.0f} env "
             "steps/s |"]
    return "\n".join(lines) + "\n"


def purejaxrl_sps(python: str, checkout: str, envs: int, steps: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(PUREJAXRL_STEADY)
        f.flush()
        out = subprocess.run([python, f.name, checkout, str(envs), str(steps)], capture_output=True, text=True,
                             timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"purejaxrl {envs} envs failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(out.stdout.split("RESULT sps=", 1)[1].split()[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--purejaxrl", help="a purejaxrl checkout")
    p.add_argument("--jax-python", help="a Python with jax, flax, optax, distrax, gymnax")
    p.add_argument("--breakdown", type=int, default=None, metavar="B", help="time the parts of fnrl's iteration at B envs")
    p.add_argument("--breakdown-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--envs", default="4,64")
    p.add_argument("--threads", type=int, default=1, help="fnrl's torch threads (default 1, as `fnrl train`)")
    args = p.parse_args(argv)
    if args.breakdown_worker:
        print(json.dumps(breakdown_worker(*args.breakdown_worker)))
        return 0
    if args.breakdown is not None:
        report = breakdown(args.breakdown, args.steps, args.threads)
        prepend_report(OUTPUT, report)
        print(report)
        return 0
    if not (args.purejaxrl and args.jax_python):
        p.error("--purejaxrl and --jax-python are needed (or --breakdown B)")
    widths = [int(e) for e in args.envs.split(",")]
    kinds = ("graph", "envpool", "purejaxrl")
    sps = {(b, k): [] for b in widths for k in kinds}
    for r in range(args.rounds):
        for b in widths:
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                sps[b, kind].append(purejaxrl_sps(args.jax_python, args.purejaxrl, b, args.steps)
                                    if kind == "purejaxrl" else fnrl_sps(b, args.steps, args.threads, kind == "graph"))
                print(f"round {r + 1}: {b} envs {kind} {sps[b, kind][-1]:,.0f} SPS", flush=True)
    lines = ["# Steady PPO CartPole-v1: fnrl's graph sampler and EnvPool path against purejaxrl", "",
             f"Machine: {cpu_model()}; fnrl with {args.threads} torch thread(s), purejaxrl's XLA on every core. "
             f"{args.rounds} rounds of {args.steps:,} env steps per run, the contenders in turns (their order "
             "reversed every other round); purejaxrl's `ppo.py` settings (B envs x 128 steps, 4 epochs x 4 "
             "minibatches). SPS: fnrl over the second half of its run (compiled; `--sampler graph`, or EnvPool "
             "stepped from the serial sampler), purejaxrl over a second jitted call of its whole training; median "
             "(range) over rounds. Ratio: the medians', and its range over rounds (each round's fnrl over the same "
             "round's purejaxrl).", "",
             "| envs | fnrl `--sampler graph` | purejaxrl | graph / purejaxrl | fnrl EnvPool | purejaxrl | "
             "EnvPool / purejaxrl |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in widths:
        lines.append(f"| {b} | {in_turns(sps[b, 'graph'], sps[b, 'purejaxrl'])} | "
                     f"{in_turns(sps[b, 'envpool'], sps[b, 'purejaxrl'])} |")
    lines += ["", f"Reproduce: `python benchmarks/probes/purejaxrl_steady.py --purejaxrl DIR --jax-python PY "
                  f"--rounds {args.rounds} --steps {args.steps} --envs {args.envs} --threads {args.threads}`."]
    prepend_report(OUTPUT, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
