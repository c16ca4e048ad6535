"""Compiling with Inductor's `cpp_wrapper` on the CPU, and a setting compiled steps need on some
torch versions (`apply_workarounds`, which `fnrl.train` and `fnrl.evaluate` call; a program that
compiles fnrl's primitives itself on such a torch calls it too).

torch < 2.12: Inductor's loop reordering after fusion fails with a bare AssertionError
(`ForeachKernelSchedulerNode.reorder_loops_by_dep_pair`, pytorch/pytorch#176591, fixed by
#176849 in 2.12) on CUDA graphs that mix `torch._foreach_*` ops with reductions over tensors
of other shapes: every fnrl update, whose optimizer's foreach ops sit beside the loss (seen
compiling PPO's minibatch step, torch 2.11 on an H200, `benchmarks/gpu_graphs.md`). There it is
turned off; it only reorders loops for speed.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


LOOP_ORDERING_BROKEN = _release(torch.__version__) < (2, 12)
"""This torch's Inductor has pytorch#176591 (module docstring)."""


def apply_workarounds() -> None:
    """Turn off what this torch's Inductor gets wrong for fnrl's steps (module docstring): loop
    reordering after fusion where `LOOP_ORDERING_BROKEN`. A no-op on other versions; idempotent."""
    if LOOP_ORDERING_BROKEN:
        import torch._inductor.config as config

        config.loop_ordering_after_fusion = False


def first_tensor(*args) -> torch.Tensor:
    """The first tensor among `args` (a TensorDict's first leaf counts)."""
    for a in args:
        if torch.is_tensor(a):
            return a
        if isinstance(a, TensorDictBase):
            for v in a.values(include_nested=True, leaves_only=True):
                return v
    raise TypeError("no tensor among the arguments")


def compile_on_first_call(fn, **compile_kwargs):
    """`torch.compile(fn, **compile_kwargs)`, made at the first call: a function that is never called
    (e.g. the pieces of an update that an ahead-of-time model serves) never imports TorchDynamo."""
    compiled = None

    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, **compile_kwargs)
        return compiled(*args, **kwargs)
    return call


def compile_with_cpp_wrapper_on_cpu(fn, options: dict | None = None, **compile_kwargs):
    """`torch.compile(fn, options=options, **compile_kwargs)`, compiled once per device type of
    its first tensor argument, with Inductor's `cpp_wrapper` (the graph's calls made from C++
    instead of a Python wrapper) on the CPU only: that is where the wrapper's host time bounds
    a small step; on a GPU the host time overlaps the kernels and CUDA graphs remove it."""
    compiled = {}

    def call(*args, **kwargs):
        kind = first_tensor(*args).device.type
        if kind not in compiled:
            extra = {"cpp_wrapper": True} if kind == "cpu" else {}
            compiled[kind] = torch.compile(fn, options={**(options or {}), **extra}, **compile_kwargs)
        return compiled[kind](*args, **kwargs)
    return call
