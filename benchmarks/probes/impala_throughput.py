"""IMPALA throughput on CartPole-v1: central inference with actor processes vs the serial sampler.

Side by side in one run, the same 16 envs and the same IMPALA policy (MLP 64x64):
1. raw EnvPool, 16 envs in one pool, random actions (the ceiling, no policy, no torch);
2. SerialSampler: EnvPool in-process, the policy in the same process, [20, 16] rollouts;
3. CentralSampler: 2 actor processes x 8 envs, central batched inference in this process,
   [20, 8] trajectories popped 2 at a time and discarded (no learner);
4. the whole IMPALA training loop (`fnrl train impala`, eager update), its steady-state SPS
   (mean of the progress rows after the first 20k steps), policy lag and inference batch.

Writes benchmarks/probes/impala_throughput.md.

    python benchmarks/probes/impala_throughput.py [--seconds 10] [--train-steps 100000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fnrl import envs
from fnrl.algos import impala
from fnrl.samplers import SerialSampler
from fnrl.samplers.central import CentralSampler
from fnrl.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def raw_envpool(seconds: float) -> float:
    import envpool

    env = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=16, seed=0,
                       num_threads=envs.envpool_threads("CartPole-v1"))   # as fnrl's envs step
    env.reset()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(np.random.randint(0, 2, 16).astype(np.int32))
        steps += 16
    return steps / (time.perf_counter() - t0)


def serial(seconds: float, agent, state) -> float:
    env = envs.make("CartPole-v1", 16, seed=0)
    sampler = SerialSampler(env, agent.act, 20)
    sampler.collect(state)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sampler.collect(state)
        steps += 20 * 16
    sps = steps / (time.perf_counter() - t0)
    env.close()
    return sps


def central(seconds: float, agent, state) -> tuple[float, float]:
    sampler = CentralSampler("CartPole-v1", 8, 2, agent.act, state, horizon=20, obs_shape=(4,),
                             obs_dtype=torch.float32, num_slots=8)
    with sampler:
        sampler.get(2)
        steps, t0, f0, r0 = 0, time.perf_counter(), sampler.forwards, sampler.requests
        while time.perf_counter() - t0 < seconds:
            sampler.get(2)
            steps += 20 * 16
        sps = steps / (time.perf_counter() - t0)
        batch = (sampler.requests - r0) / max(sampler.forwards - f0, 1)
    return sps, batch


def training(total: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        result = train("impala", impala.Config(total_steps=total), seed=0, log_dir=Path(d) / "run", compile=False,
                       quiet=True, tensorboard=False, plot=False)
    rows = [r for r in result.history if r["env_steps"] > 20_000]
    return {"sps": float(np.mean([r["sps"] for r in rows])),
            "lag": float(np.mean([r["policy_lag_mean"] for r in rows])),
            "batch": float(np.mean([r["inference_batch"] for r in rows])), "return": result.return_mean}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--train-steps", type=int, default=100_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = envs.env_spec("CartPole-v1")
    agent = impala.make(impala.Config(), spec)
    state = agent.init(0)
    rows = []
    for name, fn in [("raw EnvPool, 16 envs, random actions", lambda: (raw_envpool(args.seconds), None)),
                     ("SerialSampler, 16 envs, policy in-process", lambda: (serial(args.seconds, agent, state), None)),
                     ("CentralSampler, 2 actors x 8 envs", lambda: central(args.seconds, agent, state))]:
        before = load()
        sps, batch = fn()
        rows.append((name, sps, batch, before))
        print(f"{name}: {sps:,.0f} SPS (load {before})", flush=True)
    before = load()
    tr = training(args.train_steps)
    print(f"training: {tr}", flush=True)
    ceiling = rows[0][1]
    lines = [
        "# IMPALA throughput, CartPole-v1", "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 intra-op thread. "
        "Shared machine: absolute numbers move between runs; the ratios in one run are the result.", "",
        "| sampler | SPS | x raw | requests per forward | load avg before |", "|---|---:|---:|---:|---|"]
    for name, sps, batch, ld in rows:
        lines.append(f"| {name} | {sps:,.0f} | {sps / ceiling:.2f} | {'' if batch is None else f'{batch:.2f}'} | {ld} |")
    lines += ["", f"Whole IMPALA training loop (`fnrl train impala`, defaults, eager update, {args.train_steps:,} "
              f"steps, load avg before {before}): {tr['sps']:,.0f} SPS in steady state, policy lag "
              f"{tr['lag']:.2f} updates, {tr['batch']:.2f} actor requests per inference forward, final return "
              f"{tr['return']:.1f}.", "", "Generated by `python benchmarks/probes/impala_throughput.py`."]
    out = Path(__file__).with_name("impala_throughput.md")
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
