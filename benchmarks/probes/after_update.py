"""What an update costs the host work after it: SAC HalfCheetah's act and env step, warm and after an update.

The off-policy loop's host work per env step (act, EnvPool's step, the rollout writes, replay
add: `offpolicy_profile.py`) takes several times longer in the training loop than the same calls
back to back. This measures why, in one process, interleaved over rounds:

| condition | what runs before each timed call |
|---|---|
| back to back | nothing: the timed call again |
| after 20 GEMMs, 1 thread | twenty [256, 256] x [256, 256] products on one thread (no OpenMP worker spins after it) |
| after an update | one compiled SAC update (batch 256, 256-256 MLPs) on every core, as `fnrl train` runs it |

timed calls: `act` (the compiled acting step on one observation) and `env` (one EnvPool
HalfCheetah-v4 step of one env: send + recv). Prints a markdown table of the medians (µs).

    python benchmarks/probes/after_update.py [--rounds 5] [--calls 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository: experiments

import torch  # noqa: E402

from machine import cpu_model  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="timed calls per condition and round")
    args = parser.parse_args(argv)

    from experiments.mujoco import config as mujoco_config
    from fnrl import envs, replay
    from fnrl.algos import qpg
    from fnrl.samplers import SerialSampler

    cores = len(os.sched_getaffinity(0))
    cfg = mujoco_config("sac", "HalfCheetah-v4", learning_starts=2_000)
    env = envs.make("HalfCheetah-v4", 1, seed=0)
    agent = qpg.make(cfg, env.spec)
    state = agent.init(0)
    sampler = SerialSampler(env, agent.act, 1000)
    buffer = None
    for _ in range(2):
        rollout = sampler.collect(state)
        buffer = buffer or replay.init(rollout, cfg.buffer_size, gamma=cfg.gamma)
        buffer = replay.add(buffer, rollout)
    batch = replay.sample(buffer, cfg.batch_size)
    update = torch.compile(agent.update, fullgraph=True)
    act = torch.compile(agent.act, fullgraph=True)
    obs = rollout["obs"][0].clone()
    action = torch.zeros(1, env.spec.action_dim)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def run_update():
        torch.set_num_threads(cores)
        update(state, batch)   # the result is dropped: every call updates the same state
        torch.set_num_threads(1)

    def run_gemms():
        for _ in range(20):
            torch.mm(a, b)

    before = {"back to back": lambda: None, "after 20 GEMMs, 1 thread": run_gemms, "after an update": run_update}
    timed = {"act": lambda: act(state, obs, None), "env": lambda: env.step_arrays(action)}
    torch.set_num_threads(1)
    for fn in (run_update, run_update, *timed.values()):   # compile and warm up
        fn()
    samples = {(c, t): [] for c in before for t in timed}
    for _ in range(args.rounds):
        for c, prepare in before.items():
            for t, call in timed.items():
                for _ in range(args.calls):
                    prepare()
                    start = time.perf_counter()
                    call()
                    samples[c, t].append(time.perf_counter() - start)
    env.close()
    print(f"Machine: {cpu_model()}, {cores} cores, GPU: none used, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f} at the end.\n")
    print(f"Median µs per call over {args.rounds} rounds x {args.calls} calls, conditions interleaved:\n")
    print("| condition | " + " | ".join(f"{t} µs" for t in timed) + " |")
    print("|---|" + "---:|" * len(timed))
    for c in before:
        cells = [f"{1e6 * statistics.median(samples[c, t]):.0f}" for t in timed]
        print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
