"""One env step through `fnrl.envs` (EnvPool vs gymnasium in-process), with the caller busy in between.

A training loop does work between env steps (acting, recording, updates), and EnvPool's
worker thread falls asleep in that time, so each step pays the hand-off to the worker and
back. This times `BatchedEnv.step_arrays` (the adaptor the samplers use, random-free
constant actions) for both backends, B envs, with `--work` µs of busy-waiting by the caller
between steps; the backends alternate in rounds, so a change in machine load hits both
alike. It is the measurement behind `fnrl.envs.steps_in_process` (up to 4 classic-control
envs are stepped in-process). A third column steps the same gymnasium envs through gymnasium's
own `SyncVectorEnv` (what `fnrl.envs.make` used before `fnrl.envs.inprocess.InProcessEnvs`).

    python benchmarks/probes/env_step.py [--rounds 3] [--steps 2000] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

from fnrl import envs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
BACKENDS = ("envpool", "gymnasium", "sync")


def make(env_id: str, num_envs: int, backend: str):
    """`fnrl.envs.make` with `backend`; "sync": gymnasium's envs in its own SyncVectorEnv."""
    if backend != "sync":
        return envs.make(env_id, num_envs, seed=0, backend=backend)
    env = envs.make(env_id, num_envs, seed=0, backend="gymnasium")
    env.raw = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
    return env


def busy(us: float) -> None:
    """Keep this thread busy for `us` microseconds (the loop's own work between steps)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def step_us(env, action, steps: int, work: float) -> float:
    """Mean µs of `env.step_arrays(action)` with `work` µs of the caller's work between steps."""
    for _ in range(200):
        env.step_arrays(action)
        busy(work)
    spent = 0.0
    for _ in range(steps):
        t = time.perf_counter()
        env.step_arrays(action)
        spent += time.perf_counter() - t
        busy(work)
    return spent / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    cases = [(env_id, B, work) for env_id in ("CartPole-v1", "Pendulum-v1") for B in (1, 2, 4, 8)
             for work in (0, 30, 100)]
    lines = [
        "# One env step: EnvPool vs gymnasium in-process (fnrl's InProcessEnvs and gymnasium's SyncVectorEnv)",
        "",
        f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none used, torch {torch.__version__}, "
        f"Python {platform.python_version()}. Load average at start {load_start}.",
        "",
        "µs per `BatchedEnv.step_arrays` call (all B envs; EnvPool with fnrl's default of 1 thread for "
        "classic control), the caller busy for `work` µs between steps; medians over "
        f"{args.rounds} alternating rounds of {args.steps} steps.",
        "",
        "| env | B | work µs | EnvPool µs | in-process µs | SyncVectorEnv µs | EnvPool / in-process "
        "| SyncVectorEnv / in-process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for env_id, B, work in cases:
        made = {b: make(env_id, B, b) for b in BACKENDS}
        for env in made.values():
            env.reset()
        action = (torch.zeros(B, dtype=torch.int64) if made["envpool"].spec.discrete
                  else torch.zeros(B, *made["envpool"].spec.action_shape))
        times = {b: [] for b in BACKENDS}
        for _ in range(args.rounds):
            for b, env in made.items():
                times[b].append(step_us(env, action, args.steps, work))
        for env in made.values():
            env.close()
        pool, inproc, sync = (statistics.median(times[b]) for b in BACKENDS)
        lines.append(f"| {env_id} | {B} | {work} | {pool:.1f} | {inproc:.1f} | {sync:.1f} | {pool / inproc:.2f}x "
                     f"| {sync / inproc:.2f}x |")
        print(lines[-1], flush=True)
    lines += ["", f"Load average at end {'/'.join(f'{x:.2f}' for x in os.getloadavg())}. "
              "Reproduce: `python benchmarks/probes/env_step.py`", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
