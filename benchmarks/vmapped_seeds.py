"""Vmapped seeds: total env steps per second of K seeds in one process vs one seed.

PPO on CartPole-v1 with the default config (`fnrl train ppo`: 8 envs x 32 steps, 20 epochs
x 1 minibatch, 64-64 tanh MLPs), compiled, threads=1 and the update's threads as `fnrl train`
chooses them (`update_threads_for`: both cores for the 8 x 256-row vmapped update), guard
checks skipped once warm (`fnrl.train._steady`). Contenders, built side by side in one
process and timed in alternating rounds (so a change in machine load hits both alike):

- single: what `fnrl train ppo --seed 0` runs (8 envs; compiled act and update pieces);
- vmapped K: what `fnrl train ppo --num-seeds K` runs (one EnvPool of K x 8 envs; act and
  update vmapped over the K seeds, then compiled).

One iteration = one collect of 32 steps from every env + one PPO update (all 20 epochs), the
training loop's own work without logging. SPS = env steps of all seeds together per second.
Compile time (the first two iterations) is reported apart and not counted in SPS.
Writes benchmarks/vmapped_seeds.md (or --out).

    python benchmarks/vmapped_seeds.py [--seeds 8] [--rounds 5] [--iters 10] [--eager]
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
from fnrl.train import _intra_op_threads, _make_agent, _steady, update_threads_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
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
            self.agent = _make_agent(ppo, config, self.env.spec, compile)
        else:
            rows = seeds.make_rows(ppo, config, 0, num_seeds)
            self.env = envs.make(config.env_id, num_seeds * config.num_envs,
                                 seed=seeds.env_seeds(rows, config.num_envs))
            self.agent = seeds.make_agent(ppo, rows, self.env.spec, config.num_envs, compile)
        self.state = self.agent.init(0)
        self.sampler = SerialSampler(self.env, self.agent.act, config.num_steps)
        self.steps_per_iter = config.num_steps * config.num_envs * num_seeds
        self.seconds, self.steps = 0.0, 0

    def iterate(self, n: int, timed: bool = True) -> float:
        t = time.perf_counter()
        for _ in range(n):
            with _steady(self.warm):
                rollout = self.sampler.collect(self.state)
            self.state["env_steps"] += self.steps_per_iter // self.width
            with _steady(self.warm), _intra_op_threads(self.update_threads):
                self.state, metrics = self.agent.update(self.state, rollout)
        float(metrics["loss"].sum())
        self.warm = self.compile
        dt = time.perf_counter() - t
        if timed:
            self.seconds += dt
            self.steps += n * self.steps_per_iter
        return dt

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
        "| mode | contender | env steps / iteration | SPS | warm-up s | ratio vmapped / single |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for compile, single, many, warm in results:
        mode = "compiled" if compile else "eager"
        ratio = many.sps / single.sps
        lines.append(f"| {mode} | single seed | {single.steps_per_iter:,} | {single.sps:,.0f} | "
                     f"{warm['single']:.1f} | |")
        lines.append(f"| {mode} | vmapped x{args.seeds} | {many.steps_per_iter:,} | {many.sps:,.0f} | "
                     f"{warm['vmapped']:.1f} | **{ratio:.2f}x** {'✓' if ratio >= 4 else '✗'} (target 4x) |")
    lines += ["", "Reproduce: `PYTHONPATH=. python benchmarks/vmapped_seeds.py" +
              (" --eager" if args.eager else "") + "`", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
