"""First-compile time of the return primitives under torch.compile(fullgraph=True).

fnrl.returns writes every recursive return as a log-depth scan, so compile time should hardly
grow with T. For contrast, a naive `for t in reversed(range(T))` GAE unrolls T steps into the
graph (measured at T=16 and T=128 only: T=512 takes minutes).

Each measurement starts from `torch._dynamo.reset()` and times the first call of the compiled
function (tracing + Inductor codegen + the run), as wall time and as CPU time of this process
(steadier when other jobs share the CPUs). Writes benchmarks/probes/returns_compile_time.md.

    python benchmarks/probes/returns_compile_time.py
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from fnrl.returns import gae, vtrace

import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

B = 8


def naive_gae(reward, value, next_value, discount, done, lam):
    """GAE as a per-step Python loop: the graph holds T unrolled steps."""
    advantage, out = torch.zeros_like(reward[0]), []
    for t in reversed(range(reward.shape[0])):
        delta = reward[t] + discount[t] * next_value[t] - value[t]
        advantage = delta + discount[t] * lam * (~done[t]) * advantage
        out.append(advantage)
    return torch.stack(out[::-1])


def rollout(T: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    done = torch.rand(T, B, generator=g) < 0.05
    return dict(
        log_rho=0.3 * torch.randn(T, B, generator=g),
        reward=torch.randn(T, B, generator=g),
        value=torch.randn(T, B, generator=g),
        next_value=torch.randn(T, B, generator=g),
        discount=0.99 * (torch.rand(T, B, generator=g) > 0.02).float(),
        done=done,
    )


def calls(x: dict[str, torch.Tensor]):
    gae_args = (x["reward"], x["value"], x["next_value"], x["discount"], x["done"], 0.95)
    return {
        "gae (log-depth scan)": (gae, gae_args),
        "vtrace (log-depth scan)": (vtrace, (x["log_rho"], *gae_args[:5])),
        "naive reversed-loop gae": (naive_gae, gae_args),
    }


def measure(fn, args) -> tuple[float, float]:
    """Wall and process-CPU seconds of the first call of `torch.compile(fn, fullgraph=True)`."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def warm_up() -> None:
    """Pay Inductor's one-time start-up (imports, C++ toolchain probe) before measuring."""
    torch._dynamo.reset()
    torch.compile(lambda x: torch.cat([x[1:], x[:1]]) * 2, fullgraph=True)(torch.ones(3))


def main() -> None:
    plan = [("gae (log-depth scan)", 16), ("gae (log-depth scan)", 512),
            ("vtrace (log-depth scan)", 16), ("vtrace (log-depth scan)", 512),
            ("naive reversed-loop gae", 16), ("naive reversed-loop gae", 128)]
    torch._inductor.config.fx_graph_cache = False  # cold compiles, never a cache hit
    torch._inductor.config.compile_threads = 1  # all compile work in this process (CPU time counts it)
    warm_up()
    rows = []
    for name, T in plan:
        fn, args = calls(rollout(T))[name]
        wall, cpu = measure(fn, args)
        rows.append(f"| {name} | {T} | {wall:.1f} | {cpu:.1f} |")
        print(rows[-1], flush=True)
    table = "\n".join([
        "# First-compile time of fnrl.returns (torch.compile, fullgraph=True)",
        "",
        f"Machine: {os.cpu_count()} CPUs (nproc), {cpu_model()}; torch {torch.__version__}; "
        f"Python {platform.python_version()}; B = {B}, float32, CPU.",
        "Each row starts from `torch._dynamo.reset()`, Inductor's FX graph cache off, compile_threads=1, "
        "after one warm-up compile. First call = trace + compile + run (wall and CPU time of the process; "
        "the machine is shared, so CPU time is the steadier figure). "
        "Produced by `python benchmarks/probes/returns_compile_time.py`.",
        "",
        "| function | T | first call wall (s) | first call CPU (s) |",
        "|---|---:|---:|---:|",
        *rows,
        "",
    ])
    print(table)
    Path(__file__).with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
