"""How many torch threads a run's pieces use: the update's own count, and scoped changes of it.

The measurements behind `update_threads_for` are in docs/decisions.md ("Threads")."""
from __future__ import annotations

import contextlib
import os

import torch

UPDATE_MACS_FOR_ALL_CORES = 2048 * 64 * 64
"""Updates whose widest matrix product (rows x width in x width out of one hidden layer, all
vmapped rows together) has at least this many multiply-adds run on every core: PPO CartPole's
2048-row minibatches through its 64x64 layer."""


def widest_layer(hidden) -> int:
    """in x out of the widest hidden-to-hidden layer of an MLP with hidden sizes `hidden` (h x h for one)."""
    widths = tuple(hidden or ())
    if len(widths) < 2:
        return widths[0] ** 2 if widths else 0
    return max(a * b for a, b in zip(widths, widths[1:]))


def update_threads_for(config, off_policy: bool, width: int, threads: int | None,
                       images: bool = False) -> int | None:
    """The torch intra-op threads of the update when `--update-threads` is not given.

    The envs are idle while the serial loop updates, so the update's matrix products can have
    every core. That pays from about 2048 x 64 x 64 multiply-adds per layer
    (`UPDATE_MACS_FOR_ALL_CORES`: rows = an on-policy minibatch or an off-policy batch, times
    the vmapped rows `width`, times `widest_layer(config.hidden)`), or at any size with image
    observations (conv torso); smaller updates stay on `threads`. None keeps torch's own default."""
    if threads is None:
        return threads
    if off_policy:
        rows = config.batch_size * width
    else:
        rows = config.num_envs * config.num_steps // getattr(config, "num_minibatches", 1) * width
    macs = rows * widest_layer(getattr(config, "hidden", ()))
    return len(os.sched_getaffinity(0)) if images or macs >= UPDATE_MACS_FOR_ALL_CORES else threads


@contextlib.contextmanager
def intra_op_threads(n: int | None):
    """torch's intra-op threads set to `n` for a while (a no-op for None or the current count)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def environ(name: str, value: str):
    """Set environment variable `name` (seen by this process and the ones it starts) for a while."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
