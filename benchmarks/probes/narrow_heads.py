"""Narrow heads: compiled PPO updates with `fnrl.nets.NarrowLinear` heads vs GEMM heads.

`fnrl.nets.NarrowLinear`, the actor-critic's policy and value heads, computes a layer with
at most `NARROW_OUT` outputs as a broadcast product summed over its inputs when compiled,
instead of the `addmm` of `F.linear` (see its docstring). This script times the compiled
update of each workload with `NARROW_OUT = 8` (fnrl's default) and `NARROW_OUT = 0` (every
layer a GEMM).
Both sides share one agent, one state and one batch: TorchDynamo guards on the module
constant, so the compiled function holds one graph per value and the flag picks it.
Rounds alternate the two sides (A, B, A, B, ...; the median of the per-round ratios), so
the machine's drift hits both alike. Each side trains its own copy of the state.

- PPO CartPole with CleanRL's settings at 64 envs x 128 steps (2048-row minibatches, the
  64-env milestone's workload) and at 4 envs, on the threads `fnrl train` picks;
- PPO's default config, one seed and 8 vmapped seeds (the vmapped-seeds ratio).

    python benchmarks/probes/narrow_heads.py [--rounds 21] [--only ppo64,ppo4,seeds] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

import fnrl.nets.core as core
from fnrl import envs, samplers, seeds
from fnrl.algos import ppo
from fnrl.accel.compiled import make_agent
from fnrl.run.threads import intra_op_threads, update_threads_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the other probes
import suite  # noqa: E402
from machine import cpu_model  # noqa: E402
from threads import interleaved  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
SIDES = {"gemm": 0, "narrow": core.NARROW_OUT}
"""Side name -> NARROW_OUT while that side runs (the first side is the baseline of the ratio)."""


def _with_narrow(value: int, fn):
    def run():
        saved, core.NARROW_OUT = core.NARROW_OUT, value
        try:
            fn()
        finally:
            core.NARROW_OUT = saved
    return run


def _compare(label: str, update_calls, threads: int, rounds: int) -> str:
    """`update_calls(side)` -> a function of no arguments running a few updates on that side's state."""
    sides = {name: _with_narrow(value, update_calls(name)) for name, value in SIDES.items()}
    with intra_op_threads(threads):
        for run in sides.values():   # compile each side's graph, then warm up
            run(), run()
        med, ratio = interleaved(sides, rounds)
    return (f"| {label} | {threads} | {med['gemm'] * 1e3:.2f} ms | {med['narrow'] * 1e3:.2f} ms "
            f"| {ratio['narrow']:.3f}x |")


def ppo_update(label: str, config: ppo.Config, num_seeds: int, rounds: int, calls: int = 3) -> str:
    env = envs.make(config.env_id, num_seeds * config.num_envs, seed=0)
    if num_seeds == 1:
        agent = make_agent(ppo, config, env.spec, compile=True)
    else:
        agent = seeds.make_agent(ppo, seeds.make_rows(ppo, config, 0, num_seeds), env.spec, config.num_envs)
    state = agent.init(0)
    sampler = samplers.make("serial", env, agent.act, config.num_steps)
    rollout = sampler.collect(state).clone()
    sampler.close()
    states = dict.fromkeys(SIDES, state)

    def update_calls(side):
        def run():
            for _ in range(calls):
                states[side], _ = agent.update(states[side], rollout)
        return run

    return _compare(label, update_calls, update_threads_for(config, False, num_seeds, 1), rounds)


WORKLOADS = {
    "ppo64": lambda r: ppo_update("PPO CartPole, CleanRL settings, 64 envs (2048-row minibatches)",
                                  ppo.Config(**{**suite.CARTPOLE_PPO, "num_envs": 64, "total_steps": 500_000}), 1, r),
    "ppo4": lambda r: ppo_update("PPO CartPole, CleanRL settings, 4 envs (128-row minibatches)",
                                 ppo.Config(**suite.CARTPOLE_PPO), 1, r),
    "seeds": lambda r: "\n".join([
        ppo_update("PPO default config, 1 seed (8 envs x 32, 20 epochs)", ppo.Config(), 1, r),
        ppo_update("PPO default config, 8 vmapped seeds", ppo.Config(), 8, r)]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated: " + ",".join(WORKLOADS))
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start, load = time.perf_counter(), "/".join(f"{x:.2f}" for x in os.getloadavg())
    rows = []
    for key in args.only.split(","):
        rows.append(WORKLOADS[key](args.rounds))
        print(rows[-1], flush=True)
    lines = [
        "# Narrow heads: elementwise narrow layers vs GEMMs in compiled updates", "",
        f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none used, torch {torch.__version__}, "
        f"Python {platform.python_version()}. Load average at start: {load}; whole run "
        f"{time.perf_counter() - start:.0f} s.", "",
        f"Median time per round (a few updates), {args.rounds} interleaved rounds; `narrow / gemm` is the median "
        "per-round speed-up of `NARROW_OUT = 8` (fnrl's default) over `NARROW_OUT = 0`. Generated by "
        "`python benchmarks/probes/narrow_heads.py`.", "",
        "| workload | threads | every layer a GEMM | narrow heads elementwise | speed-up |",
        "|---|---:|---:|---:|---:|", *rows, ""]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
