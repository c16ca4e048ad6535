"""Vmapped seeds: total env steps per second of K seeds in one process vs one seed.

PPO on CartPole-v1 with the default config (`fnrl train ppo`: 8 envs x 32 steps, 20 epochs
x 1 minibatch, 64-64 tanh MLPs), compiled, threads=1 and the update's threads as `fnrl train`
chooses them (`update_threads_for`: both cores for the 8 x 256-row vmapped update), guard
checks skipped once warm (`fnrl.accel.compiled.steady`). Contenders, built side by side in one
process and timed in alternating rounds (so a change in machine load hits both alike):

- single: what `fnrl train ppo --seed 0` runs (8 envs; compiled act and update pieces);
- vmapped K: what `fnrl train ppo --num-seeds K` runs (one EnvPool of K x 8 envs; act and
  update vmapped over the K seeds, then compiled).

One iteration = one collect of 32 steps from every env + one PPO update (all 20 epochs), the
training loop's own work without logging. SPS = env steps of all seeds together per second.
Compile time (the first two iterations) is reported apart and not counted in SPS.
Writes benchmarks/probes/vmapped_seeds.md (or --out).

    python benchmarks/probes/vmapped_seeds.py [--seeds 8] [--rounds 5] [--iters 10] [--eager]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from fnrl import envs, seeds
from fnrl.algos import ppo
from fnrl.samplers import SerialSampler
from fnrl.accel.compiled import make_agent, steady
from fnrl.run.threads import intra_op_threads, update_threads_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


class Contender:
    """An env pool, an agent and a sampler: one training loop without the logging."""

    def __init__(self, config: ppo.Config, num_seeds: int, compile: bool, threads: int):
        self.width = num_seeds
        # as `fnrl train` runs it: the update on every core from 2048 rows (8 seeds x 256), guards
        # skipped once the compiled pieces are warm
        self.update_threads = update_threads_for(config, False, num_seeds, threads)
        self.compile, self.warm = compile, False
        if num_seeds == 1:
            self.env = envs.make(config.env_id, config.num_envs, seed=0)
            self.agent = make_agent(ppo, config, self.env.spec, compile)
        else:
            rows = seeds.make_rows(ppo, config, 0, num_seeds)
            self.env = seeds.make_env(config.env_id, rows, config.num_envs)
            self.agent = seeds.make_agent(ppo, rows, self.env.spec, config.num_envs, compile)
        self.state = self.agent.init(0)
        self.sampler = SerialSampler(self.env, self.agent.act, config.num_steps)
        self.steps_per_iter = config.num_steps * config.num_envs * num_seeds
        self.seconds, self.steps, self.iterations = 0.0, 0, 0
        self.collect_s = self.update_s = 0.0

    def iterate(self, n: int, timed: bool = True) -> float:
        t = time.perf_counter()
        collect_s = update_s = 0.0
        for _ in range(n):
            t0 = time.perf_counter()
            with steady(self.warm):
                rollout = self.sampler.collect(self.state)
            self.state["env_steps"] += self.steps_per_iter // self.width
            t1 = time.perf_counter()
            with steady(self.warm), intra_op_threads(self.update_threads):
                self.state, metrics = self.agent.update(self.state, rollout)
            collect_s, update_s = collect_s + t1 - t0, update_s + time.perf_counter() - t1
        float(metrics["loss"].sum())
        self.warm = self.compile
        dt = time.perf_counter() - t
        if timed:
            self.seconds += dt
            self.steps += n * self.steps_per_iter
            self.iterations += n
            self.collect_s += collect_s
            self.update_s += update_s
        return dt

    def ms_per_iteration(self, seconds: float) -> float:
        return seconds / self.iterations * 1e3

    @property
    def sps(self) -> float:
        return self.steps / self.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10, help="iterations per contender per round")
    parser.add_argument("--eager", action="store_true", help="also time both without torch.compile")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ppo.Config()
    load_start, t_start = load(), time.perf_counter()
    modes = [True, False] if args.eager else [True]
    results = []
    for compile in modes:
        single, many = (Contender(config, 1, compile, args.threads),
                        Contender(config, args.seeds, compile, args.threads))
        warm = {name: c.iterate(2, timed=False) for name, c in (("single", single), ("vmapped", many))}
        for _ in range(args.rounds):
            single.iterate(args.iters)
            many.iterate(args.iters)
        results.append((compile, single, many, warm))
        print(f"compile={compile}: single {single.sps:,.0f} SPS, vmapped x{args.seeds} {many.sps:,.0f} SPS, "
              f"ratio {many.sps / single.sps:.2f}x (load {load()})", flush=True)
        single.env.close()
        many.env.close()
    wall = time.perf_counter() - t_start

    lines = [
        f"# Vmapped seeds: PPO CartPole-v1, {args.seeds} seeds in one process vs one seed",
        "",
        f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: "
        f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (CPU only)'}, "
        f"torch {torch.__version__} ({args.threads} intra-op threads), Python {platform.python_version()}.",
        f"Load average (1/5/15 min) at start: {load_start}; at end: {load()}. Whole benchmark: {wall:.0f} s.",
        "",
        "`fnrl train ppo` default config (8 envs x 32 steps per seed, 20 epochs x 1 minibatch, 64-64 tanh MLPs), "
        "the same per seed in both contenders. single = `fnrl train ppo` (one EnvPool of 8 envs); vmapped = "
        f"`fnrl train ppo --num-seeds {args.seeds}` (one EnvPool of {args.seeds} x 8 envs, act and update "
        "vmapped over the seeds, then compiled). SPS = env steps of all seeds per second over "
        f"{args.rounds} alternating rounds of {args.iters} iterations each (collect + update, no logging), "
        "after 2 warm-up iterations; `warm-up s` includes compilation. Update threads as `fnrl train` "
        f"picks them: single {single.update_threads}, vmapped {many.update_threads}; guard checks skipped once warm.",
        "",
        "Per iteration: `collect` (32 policy + env steps into the rollout) and `update` (all epochs, as "
        "the loop calls it; CPU ops are synchronous, so each part's time is its own). A ratio of 4x needs "
        f"the vmapped iteration within {args.seeds / 4:g}x the single one.",
        "",
        "| mode | contender | env steps / iteration | collect ms | update ms | iteration ms | SPS | warm-up s | "
        "ratio vmapped / single |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for compile, single, many, warm in results:
        mode = "compiled" if compile else "eager"
        ratio = many.sps / single.sps
        for c, name, cell in ((single, "single seed", ""),
                              (many, f"vmapped x{args.seeds}",
                               f"**{ratio:.2f}x** {'✓' if ratio >= 4 else '✗'} (target 4x)")):
            lines.append(f"| {mode} | {name} | {c.steps_per_iter:,} | {c.ms_per_iteration(c.collect_s):.1f} | "
                         f"{c.ms_per_iteration(c.update_s):.1f} | {c.ms_per_iteration(c.seconds):.1f} | "
                         f"{c.sps:,.0f} | {warm['vmapped' if c is many else 'single']:.1f} | {cell} |")
    lines += ["", "Reproduce: `PYTHONPATH=. python benchmarks/probes/vmapped_seeds.py" +
              (" --eager" if args.eager else "") + "`", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
