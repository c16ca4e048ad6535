"""What the tensors-only transport (`fnrl.distributed.wire`) carries over gloo on loopback.

Two workloads, each sender and the receiver in processes of their own (one torch thread each):

- segments: actors send [T, B] segments of CartPole transitions (obs, action, reward, flags) one
  way, as asynchronous replay would; env steps per second reaching the receiver, 1 and 2 senders.
- round trip: one actor sends B observations and waits for B actions, as central inference
  (SEED) does per env step; microseconds per round trip without any inference, the wire's floor.

    python benchmarks/probes/wire_throughput.py --seconds 5 --rounds 3    # writes wire_throughput.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def segment(T: int, B: int) -> dict:
    return {"obs": torch.randn(T + 1, B, 4), "action": torch.zeros(T, B, dtype=torch.int64),
            "reward": torch.ones(T, B), "terminated": torch.zeros(T, B, dtype=torch.bool),
            "truncated": torch.zeros(T, B, dtype=torch.bool)}


def _main(rank: int, world: int, store: str, mode: str, seconds: float, T: int, B: int, out: str):
    import torch.distributed as dist

    from fnrl.distributed import wire

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    if mode == "segments":
        layout = wire.Layout.of(segment(T, B))
        if rank == 0:   # count until every sender has sent its last (count -1)
            count, running = 0, world - 1
            wire.recv(layout)
            start = time.perf_counter()
            while running:
                _, k, _ = wire.recv(layout)
                running -= k < 0
                count += k >= 0
            elapsed = time.perf_counter() - start
            Path(out).write_text(f"{count * T * B / elapsed} {_bytes(segment(T, B))}")
        else:
            message, k, start = segment(T, B), 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                wire.send(message, layout, 0, count=k)
                k += 1
            wire.send(message, layout, 0, count=-1)
    else:
        obs, action = {"obs": torch.randn(B, 4)}, {"action": torch.zeros(B, dtype=torch.int64)}
        l_obs, l_action = wire.Layout.of(obs), wire.Layout.of(action)
        n = 0
        if rank == 0:
            while True:
                _, k, _ = wire.recv(l_obs, src=1)
                if k < 0:
                    break
                wire.send(action, l_action, 1, count=k)
        else:
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                wire.send(obs, l_obs, 0, count=n)
                wire.recv(l_action, src=0)
                n += 1
            elapsed = time.perf_counter() - start
            wire.send(obs, l_obs, 0, count=-1)
            Path(out).write_text(f"{1e6 * elapsed / n} {_bytes(obs) + _bytes(action)}")
    dist.barrier()
    dist.destroy_process_group()


def _bytes(message: dict) -> int:
    from fnrl.distributed.wire import Layout

    return Layout.of(message).size   # header and body


def run(mode: str, world: int, seconds: float, T: int, B: int) -> tuple[float, int]:
    ctx = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out")
        procs = [ctx.Process(target=_main, args=(r, world, str(Path(tmp) / "store"), mode, seconds, T, B, out))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(seconds + 120)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"{mode}: a process failed: {[p.exitcode for p in procs]}")
        value, size = Path(out).read_text().split()
    return float(value), int(size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=32, help="T of a segment")
    p.add_argument("--envs", type=int, default=8, help="B of a segment and of a round trip")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from machine import cpu_model

    cases = [("segments", 2), ("segments", 3), ("round trip", 2)]
    results = {c: [] for c in cases}
    sizes = {}
    for _ in range(args.rounds):   # the cases in turns
        for mode, world in cases:
            value, sizes[mode] = run("segments" if mode == "segments" else "round", world, args.seconds,
                                     args.steps, args.envs)
            results[(mode, world)].append(value)
    lines = ["# The tensors-only transport over gloo on loopback", "",
             f"Machine: {cpu_model()}, 2 cores, torch {torch.__version__}; {time.strftime('%Y-%m-%d')}.", "",
             f"Generated by `python benchmarks/probes/wire_throughput.py --seconds {args.seconds:g} --rounds "
             f"{args.rounds}`: each process one torch thread, the cases in turns; median (rounds).", "",
             "| workload | senders | bytes per message | result |", "|---|---:|---:|---|"]
    for (mode, world), values in results.items():
        med = statistics.median(values)
        shown = ", ".join(f"{v:,.0f}" for v in values)
        if mode == "segments":
            lines.append(f"| [{args.steps}, {args.envs}] CartPole segments, one way | {world - 1} | {sizes[mode]:,} | "
                         f"{med:,.0f} env steps/s ({shown}) |")
        else:
            lines.append(f"| {args.envs} observations out, {args.envs} actions back | 1 | {sizes[mode]:,} "
                         f"(both ways) | {med:,.0f} us per round trip ({shown}) |")
    lines += ["", "The wire alone: no env, no replay, no inference. A message is one gloo send (the header "
              "and the body in one buffer), whatever its number of fields."]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (HERE / "wire_throughput.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
