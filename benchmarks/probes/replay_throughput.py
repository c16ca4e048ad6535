"""Replay throughput: add and sample, uniform and prioritized, vector obs and Atari frames.

    python benchmarks/probes/replay_throughput.py [--threads 1] [--out benchmarks/probes/replay_throughput.md]

- vector: CartPole-like rollouts [T=128, B=8] of float32 obs [4], 1M-row capacity;
- atari: EnvPool-like uint8 [4, 84, 84] frame stacks, frame-deduplicated (one 84x84 frame
  stored per row), 200k-row capacity (1.4 GB of frames);
both with n_step=3. Each buffer is first filled past its capacity (so the ring has
wrapped and the sum tree is full); add throughput is measured over that fill, then
sample(32), sample(256) and update_priorities(256) are timed on the full buffer.
Numbers are transitions (rows) per second, single process, on the CPU, with --threads
intra-op threads (default 1: on a busy machine, torch ops big enough to be split over
threads stall waiting for a busy core, which measures the neighbours, not the buffer).
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from tensordict import TensorDict

from fnrl import replay

T, B, N_STEP = 128, 8, 3


def rollout(obs: torch.Tensor, num_steps: int, episode_length: int) -> TensorDict:
    """A [T, B] rollout with episode ends every `episode_length` steps (envs staggered) and
    EnvPool's reset step after each; obs: [T + 1, B, ...]."""
    t = torch.arange(num_steps).unsqueeze(1) + 7 * torch.arange(B)
    done = t % episode_length == episode_length - 2
    valid = t % episode_length != episode_length - 1
    return TensorDict({"obs": obs[:-1], "next_obs": obs[1:], "action": torch.randint(0, 6, (num_steps, B)),
                       "reward": torch.randn(num_steps, B), "terminated": done & (t % 3 == 0),
                       "truncated": done & (t % 3 != 0), "done": done, "valid": valid},
                      batch_size=[num_steps, B])


def vector_rollout() -> TensorDict:
    return rollout(torch.randn(T + 1, B, 4), T, episode_length=60)


def atari_rollout() -> TensorDict:
    """Sliding uint8 stacks [T + 1, B, 4, 84, 84] of random frames, restarted after resets."""
    frames = torch.randint(0, 256, (T + 4, B, 84, 84), dtype=torch.uint8)
    obs = torch.stack([frames[k:k + T + 1] for k in range(4)], 2)
    return rollout(obs, T, episode_length=300)


def timed(fn, repeats: int) -> float:
    """Seconds per call of fn() over `repeats` calls (after one warm-up call)."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def bench(name: str, example: TensorDict, capacity: int, prioritized: bool, frame_dedup: bool) -> dict:
    buffer = replay.init(example, capacity, n_step=N_STEP, prioritized=prioritized, frame_dedup=frame_dedup)
    adds = capacity // (T * B) + 2
    start = time.perf_counter()
    for _ in range(adds):
        buffer = replay.add(buffer, example)
    add_s = (time.perf_counter() - start) / adds
    row = {"buffer": name, "prioritized": prioritized, "capacity": capacity,
           "add [128x8]": T * B / add_s}
    for batch_size in (32, 256):
        row[f"sample {batch_size}"] = batch_size / timed(lambda: replay.sample(buffer, batch_size, 0.4), 200)
    if prioritized:
        index = replay.sample(buffer, 256)["index"]
        td = torch.rand(256)
        row["update 256"] = 256 / timed(lambda: replay.update_priorities(buffer, index, td), 200)
    print(row, flush=True)
    return row


def machine() -> str:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"nproc={os.cpu_count()}, CPU: {model}, torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op threads), Python {platform.python_version()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "replay_throughput.md"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    vector, atari = vector_rollout(), atari_rollout()
    rows = [bench("vector obs [4] f32", vector, 1_000_000, False, False),
            bench("vector obs [4] f32", vector, 1_000_000, True, False),
            bench("Atari [4,84,84] u8, frame-dedup", atari, 200_000, False, True),
            bench("Atari [4,84,84] u8, frame-dedup", atari, 200_000, True, True)]
    columns = ["buffer", "prioritized", "capacity", "add [128x8]", "sample 32", "sample 256", "update 256"]
    fmt = lambda v: f"{v:,.0f}" if isinstance(v, float) else ("-" if v is None else str(v))
    lines = ["# Replay throughput", "",
             f"Machine: {machine()}.", "",
             "Transitions (rows) per second, higher is better; one process on the CPU, n_step=3. "
             "`add`: [T=128, B=8] rollouts written while filling the buffer past its capacity "
             "(includes sampleability and sum-tree upkeep). `sample N`: batches of N with n-step "
             "targets (and rebuilt 4-frame obs / next_obs stacks for Atari) from the full buffer. "
             "`update 256`: `update_priorities` for 256 rows. Atari capacity 200k rows = 1.4 GB of "
             "stored frames (5.6 GB without deduplication). The machine is shared with other jobs, so "
             "numbers are noisy; with torch's default 2 threads on this loaded 2-core machine, ops "
             "large enough to be split over threads (a 128-frame gather, ~1 MB) stalled for ms waiting "
             "for the busy core, so the table uses 1 thread (`--threads`).",
             "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    lines += ["", "Produced by `python benchmarks/probes/replay_throughput.py`.", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
