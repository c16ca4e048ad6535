"""Env steps per second of DQN on CartPole-v1: `--sampler serial` vs `--sampler async`, one machine.

Default DQN Config (4 envs x 4 steps per collect, replay_ratio 0.25 = 4 updates per collect,
batch 128), compiled update, threads=1. The runs alternate serial, async, serial, async, ...
(`--rounds`), so a change of machine load during the benchmark hits both alike; each row is
the steady-state rate, (env steps) / (wall seconds) between the first log row after
learning starts (compile included before it) and the last row. The async rows also give the
mean policy lag (updates) and the fraction of time the optimizer / the sampler waited.

    python benchmarks/probes/async_dqn_cartpole.py [--steps 20000] [--rounds 2] [--out benchmarks/probes/async_dqn_cartpole.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import tempfile
from pathlib import Path

from fnrl.algos import default_config
from fnrl.train import train


def steady_sps(rows: list[dict], learning_starts: int) -> float:
    rows = [r for r in rows if r["env_steps"] > learning_starts + 1_000]
    first, last = rows[0], rows[-1]
    return (last["env_steps"] - first["env_steps"]) / max(last["wall_s"] - first["wall_s"], 1e-9)


def run(sampler: str, steps: int, compile: bool) -> dict:
    config = dataclasses.replace(default_config("dqn"), total_steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        result = train("dqn", config, seed=0, log_dir=Path(tmp) / "run", compile=compile, quiet=True,
                       log_interval=1_000, tensorboard=False, plot=False, sampler=sampler)
    rows = result.history
    out = {"sampler": sampler, "sps": steady_sps(rows, config.learning_starts), "return": rows[-1]["return_mean"],
           "updates": rows[-1]["updates"]}
    if sampler == "async":
        late = [r for r in rows if r["env_steps"] > config.learning_starts + 1_000]
        out.update({k: statistics.mean(r[k] for r in late) for k in ("policy_lag", "opt_wait", "sampler_wait")})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--out", default=None, help="write a markdown table here")
    args = parser.parse_args()
    load_before = os.getloadavg()
    results = []
    for _ in range(args.rounds):
        for sampler in ("serial", "async"):
            results.append(run(sampler, args.steps, args.compile))
            print(results[-1], flush=True)
    load_after = os.getloadavg()
    mean = {s: statistics.mean(r["sps"] for r in results if r["sampler"] == s) for s in ("serial", "async")}
    lines = [
        "# DQN CartPole-v1: serial vs async sampler", "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, threads=1, "
        f"compile={args.compile}; load average before {load_before[0]:.1f}, after {load_after[0]:.1f}.",
        f"Each run: default DQN Config, {args.steps} env steps; steady-state env steps/s after learning starts.", "",
        "| run | sampler | env steps/s | updates | last return | policy lag (updates) | optimizer waits | "
        "sampler waits |", "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results):
        extra = (f"{r['policy_lag']:.1f} | {r['opt_wait']:.2f} | {r['sampler_wait']:.2f}" if r["sampler"] == "async"
                 else "- | - | -")
        lines.append(f"| {i + 1} | {r['sampler']} | {r['sps']:.0f} | {r['updates']} | {r['return']:.1f} | {extra} |")
    lines += ["", f"async / serial (mean env steps/s): {mean['async'] / mean['serial']:.2f}x", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
