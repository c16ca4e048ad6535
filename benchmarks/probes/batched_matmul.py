"""Batched vs stacked matrix products at the shapes of PPO's vmapped seeds.

`torch.bmm` of K seeds' [N, I] x [I, O] products (what `torch.func.vmap` makes of a linear
layer whose weights differ per seed) next to one `mm` of the stacked rows [K N, I] x [I, O]
(the same multiply-adds with one shared weight), forward and the two backward products,
on 1 and 2 threads. If bmm runs at mm's GFLOP/s, vmapping seeds saves call overhead only:
the arithmetic per seed stays what one seed's costs (benchmarks/probes/vmapped_seeds.md).

    python benchmarks/probes/batched_matmul.py [--calls 2000]    (writes benchmarks/probes/batched_matmul.md)
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402


def us_per_call(f, calls: int) -> float:
    for _ in range(50):
        f()
    t = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - t) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    lines = ["# Batched vs stacked matrix products (PPO's vmapped-seed shapes)", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none used, torch {torch.__version__}, "
             f"Python {platform.python_version()}. One timing of {args.calls} calls per cell.", "",
             "| threads | product | forward µs (GFLOP/s) | grad weight µs | grad input µs |", "|---|---|---|---|---|"]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for K, N, I, O in ((8, 256, 64, 64), (8, 256, 4, 64), (1, 256, 64, 64), (1, 2048, 64, 64)):
            a, w, g = torch.randn(K, N, I), torch.randn(K, I, O), torch.randn(K, N, O)
            if K == 1:
                a, w, g = a[0], w[0], g[0]
                fwd, gw, gx = (lambda: a @ w), (lambda: a.T @ g), (lambda: g @ w.T)
                name = f"mm [{N}, {I}] x [{I}, {O}]"
            else:
                fwd = lambda: torch.bmm(a, w)                       # noqa: E731
                gw = lambda: torch.bmm(a.transpose(1, 2), g)        # noqa: E731
                gx = lambda: torch.bmm(g, w.transpose(1, 2))        # noqa: E731
                name = f"bmm [{K}, {N}, {I}] x [{K}, {I}, {O}]"
            us = us_per_call(fwd, args.calls)
            lines.append(f"| {threads} | {name} | {us:.1f} ({2 * K * N * I * O / us / 1e3:.0f}) | "
                         f"{us_per_call(gw, args.calls):.1f} | {us_per_call(gx, args.calls):.1f} |")
            print(lines[-1], flush=True)
    lines += ["", "Reproduce: `python benchmarks/probes/batched_matmul.py`", ""]
    Path(__file__).with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
