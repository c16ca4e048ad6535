"""DQN's fused learner step with the target update's tensor weight in three forms: one fused
lerp reading the weight as a Python number (what `fnrl.optim.polyak` does on the CPU), a lerp
per leaf with the weight a tensor, and one fused lerp with the weight a tensor expanded to each
leaf (what it does on a GPU, where reading the number is a sync and forbids CUDA graph
capture): µs per update, ahead of time (as `fnrl train` runs it on the CPU).

Settings: benchmarks/suite.py's CARTPOLE_DQN (CleanRL dqn.py: batch 128, 120x84; the target
update's weight is tau * [update due], a 0-d tensor). Both steps are built in one process and
timed in interleaved rounds of 300 updates; the ratio is the median of the per-round ratios.

    python benchmarks/probes/polyak_weight.py [--rounds 7]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the other probes

import torch  # noqa: E402

from fnrl import algos, optim, replay  # noqa: E402
from fnrl.learner import make_learner  # noqa: E402
from learner_step import SETTINGS, filled_buffer  # noqa: E402
from suite import machine  # noqa: E402


def fused_lerp(target, online, tau):
    """`_foreach_lerp` with the weight as a number (the CPU's form)."""
    return target.lerp(online, tau)


def expanded_lerp(target, online, tau):
    """`_foreach_lerp` with the weight a tensor expanded to each leaf (a GPU's form)."""
    return target.lerp(online, target.apply(lambda t: tau.to(t.dtype).expand_as(t)))


def per_leaf_lerp(target, online, tau):
    """One lerp per leaf, the weight a tensor."""
    return target.apply(lambda t, o: torch.lerp(t, o, tau.to(t.dtype)), online)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = dataclasses.replace(algos.default_config("dqn"), **SETTINGS["dqn"])
    agent, state, buffer = filled_buffer("dqn", config, 5_000)
    kept = optim.polyak
    ways = {}
    for name, polyak in (("fused lerp, weight read as a number (CPU)", fused_lerp),
                         ("lerp per leaf, weight a tensor", per_leaf_lerp),
                         ("fused lerp, weight a tensor expanded to each leaf (GPU)", expanded_lerp)):
        optim.polyak = polyak   # traced into the step at its first call
        learn = make_learner(agent.update, config.batch_size, config.prioritized, fused=True, ahead_of_time=True)
        s = state.clone()
        for _ in range(3):
            s, _, _ = learn(s, buffer, 0.4)
        ways[name] = [learn, s]
    optim.polyak = kept
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            learn, s = way
            start = time.perf_counter()
            for _ in range(args.calls):
                replay.can_sample(buffer, config.batch_size)
                s, _, _ = learn(s, buffer, 0.4)
            times[name].append((time.perf_counter() - start) / args.calls)
            way[1] = s
    old, first, new = times.values()
    ratios = [a / b for a, b in zip(old, new)]
    first_ratios = [a / b for a, b in zip(old, first)]
    rows = [f"# DQN learner step: the target update's weight as a number or a tensor\n\nMachine: {machine(1)}.\n",
            "| target update | µs per update (median of rounds) |", "|---|---:|"]
    rows += [f"| {name} | {1e6 * statistics.median(t):.1f} |" for name, t in times.items()]
    rows.append(f"\nnumber / expanded tensor: {statistics.median(ratios):.3f}x (rounds {min(ratios):.3f}-"
                f"{max(ratios):.3f}x); number / per leaf: {statistics.median(first_ratios):.3f}x (rounds "
                f"{min(first_ratios):.3f}-{max(first_ratios):.3f}x); {args.rounds} rounds of {args.calls} updates "
                "(a ratio under 1: the number form is faster)")
    report = "\n".join(rows) + "\n"
    Path(__file__).with_suffix(".md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
