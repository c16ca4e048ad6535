"""Async DQN on CartPole-v1, env steps/s: one sampler process vs 1 and 2 actor hosts, on one machine.

One sampler process over shared memory (`--sampler async`) against 1 and 2 actor hosts over
torch.distributed (gloo on loopback, `--actor-hosts N`), and the bytes per env step each rollout
message carries.

Default DQN Config (4 envs x 4 steps per collect per actor, batch 128), compiled update, threads=1,
at DQN's replay ratio 0.25 (the learner bounds the rate) and at 0.01 (the actors and the transport
do). With `--prioritized`, also both transports with prioritized replay: the actor hosts then score
their rows' initial priorities (Ape-X), the one-machine sampler gives new rows the largest priority.
The contenders alternate within each round (`--rounds`), so a change of machine load hits
all alike; each row is the steady-state rate, (env steps) / (wall seconds) between the first log
row 1,000 env steps after learning starts and the last row, with the mean policy lag and the
fraction of time the learner waited for data.

    python benchmarks/probes/actor_hosts.py [--steps 20000] [--rounds 2] [--prioritized]   # writes actor_hosts.md
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from fnrl.algos import default_config
from fnrl.train import train

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from machine import cpu_model  # noqa: E402
CONTENDERS = {"shared memory (1 sampler process)": (0, False), "1 actor host (gloo, loopback)": (1, False),
              "2 actor hosts (gloo, loopback)": (2, False)}
PRIORITIZED = {"shared memory, prioritized": (0, True),
               "2 actor hosts, prioritized (priorities on the hosts)": (2, True)}


def steady(rows: list[dict], learning_starts: int) -> dict:
    late = [r for r in rows if r["env_steps"] > learning_starts + 1_000]
    first, last = late[0], late[-1]
    return {"sps": (last["env_steps"] - first["env_steps"]) / max(last["wall_s"] - first["wall_s"], 1e-9),
            "lag": statistics.mean(r["policy_lag"] for r in late),
            "opt_wait": statistics.mean(r["opt_wait"] for r in late)}


def run(hosts: int, prioritized: bool, steps: int, replay_ratio: float) -> dict:
    config = dataclasses.replace(default_config("dqn"), total_steps=steps, replay_ratio=replay_ratio,
                                 prioritized=prioritized)
    with tempfile.TemporaryDirectory() as tmp:
        result = train("dqn", config, seed=0, log_dir=Path(tmp) / "run", quiet=True, log_interval=1_000,
                       tensorboard=False, plot=False, sampler="async", actor_hosts=hosts, eval_episodes=0)
    return steady(result.history, config.learning_starts)


def bytes_per_step(prioritized: bool = False) -> tuple[int, int]:
    """(bytes of one rollout message, env steps in it) for the default DQN CartPole config."""
    from fnrl import algos, envs
    from fnrl.distributed import actors, wire
    from fnrl.samplers.serial import SerialSampler

    config = default_config("dqn")
    env = envs.make(config.env_id, config.num_envs, seed=0)
    try:
        agent = algos.load("dqn").make(config, env.spec)
        rollout = SerialSampler(env, agent.act, config.num_steps).collect(agent.init(0))
        priority = torch.zeros(rollout.batch_size) if prioritized else None
        return wire.Layout.of(actors._message(rollout, 0, 0.0, priority)).size, rollout.numel()
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replay-ratios", default="0.25,0.01")
    parser.add_argument("--prioritized", action="store_true", help="also the prioritized contenders")
    parser.add_argument("--out", default=str(HERE / "actor_hosts.md"))
    args = parser.parse_args()
    load = os.getloadavg()
    ratios = [float(r) for r in args.replay_ratios.split(",")]
    contenders = {**CONTENDERS, **(PRIORITIZED if args.prioritized else {})}
    results = {(ratio, name): [] for ratio in ratios for name in contenders}
    for _ in range(args.rounds):
        for ratio in ratios:
            for name, (hosts, prioritized) in contenders.items():
                results[ratio, name].append(run(hosts, prioritized, args.steps, ratio))
                print(ratio, name, results[ratio, name][-1], flush=True)
    nbytes, steps = bytes_per_step()
    lines = [f"# {__doc__.splitlines()[0]}", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch threads 1; "
             f"load average {load[0]:.2f} before. {args.rounds} rounds of {args.steps:,} env steps each, contenders "
             "alternating.", "",
             "| replay ratio | transport | env steps/s, median (range) | vs shared memory | policy lag (updates) "
             "| learner waiting |", "|---:|---|---:|---:|---:|---:|"]
    for (ratio, name), rs in results.items():
        shared = next(n for n, (hosts, p) in contenders.items() if hosts == 0 and p == contenders[name][1])
        base = statistics.median(r["sps"] for r in results[ratio, shared])
        sps = [r["sps"] for r in rs]
        lines.append(f"| {ratio} | {name} | {statistics.median(sps):,.0f} ({min(sps):,.0f}-{max(sps):,.0f}) | "
                     f"{statistics.median(sps) / base:.2f}x | {statistics.mean(r['lag'] for r in rs):.1f} | "
                     f"{statistics.mean(r['opt_wait'] for r in rs):.0%} |")
    lines += ["", f"On the wire: one rollout message is {nbytes:,} bytes for {steps} env steps, "
              f"{nbytes / steps:.0f} bytes per env step (CartPole's 4 float32 observations, action, reward, "
              "flags, episode statistics; no next observation: the replay takes it from the next row)."]
    if args.prioritized:
        nbytes, steps = bytes_per_step(prioritized=True)
        lines += ["", f"With priorities: {nbytes:,} bytes, {nbytes / steps:.0f} per env step. The prioritized rows "
                  "compare with the prioritized shared-memory sampler."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
