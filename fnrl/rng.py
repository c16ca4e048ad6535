"""A run's random streams, each spawned from the run's seed through `numpy.random.SeedSequence`.

A run with seed `s` draws everything random from streams that are independent of each other
and of every other seed's: the seed is the entropy of a `SeedSequence`, and each stream is that
sequence's child with spawn key `(stream, *key)` (O'Neill 2015; numpy's recommended way to get
independent streams from one seed). Neighbouring seeds therefore share nothing: seeds s and s + 1
get unrelated env seeds, network initializations, exploration noise, replay draws and minibatch
orders, so 8 seeds are 8 independent samples of a training run.

| stream | key | what it seeds |
|---|---|---|
| `ENV` | (rank,) | the training envs, one 31-bit seed per env (`env_seeds`) |
| `EVAL_ENV` | (rank,) | the evaluation envs (`env_seeds(..., stream=EVAL_ENV)`) |
| `INIT` | () | the networks' initial parameters (`fnrl.algos.common.init_params`) |
| `INIT` | (1,) | SAC's first gSDE noise matrices (`fnrl.algos.qpg`) |
| `GLOBAL` | (rank,) | torch's, numpy's and Python's global generators: exploration, replay draws (`seed_everything`) |
| `MINIBATCH` | () | PPO's minibatch permutations, mixed with the env step count |
| `WORKER` | (worker,) | the global generators of sampler and actor processes |

Vmapped rows keep their single-run equivalence: row k of a run with seed s uses exactly the
streams of a single run with seed s + k.

    env_seeds(0, 4)          # [4 distinct seeds] for the 4 training envs of seed 0, rank 0
    derive(0, INIT)          # the seed of seed 0's network initialization
"""
from __future__ import annotations

import random

import numpy as np
import torch

ENV, EVAL_ENV, INIT, GLOBAL, MINIBATCH, WORKER = range(6)
"""The streams (the first entry of the spawn key)."""

MAX_SEED = 0x7FFFFFFF
"""Derived seeds are 31-bit: EnvPool takes seeds in the range of int32."""


def _sequence(seed: int, stream: int, key: tuple[int, ...]) -> np.random.SeedSequence:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"a seed is a non-negative integer, got {seed!r}")
    return np.random.SeedSequence(int(seed), spawn_key=(stream, *key))


def derive(seed: int, stream: int, *key: int) -> int:
    """The 31-bit seed of `stream` (with `key`, e.g. a rank) of the run seeded `seed`."""
    return int(_sequence(seed, stream, key).generate_state(1)[0]) & MAX_SEED


def env_seeds(seed: int, num_envs: int, rank: int = 0, stream: int = ENV) -> list[int]:
    """One 31-bit seed per env for the `num_envs` envs of `rank` of the run seeded `seed`.

    The list is prefix-stable (`env_seeds(s, n)[:k] == env_seeds(s, k)`), so a pool split
    between workers gives each worker the slice of seeds its envs have in the whole pool.
    """
    if num_envs < 0:
        raise ValueError(f"num_envs must be >= 0, got {num_envs}")
    words = _sequence(seed, stream, (rank,)).generate_state(num_envs) if num_envs else []
    return [int(w) & MAX_SEED for w in words]


def seed_everything(seed: int, *key: int, stream: int = GLOBAL) -> None:
    """Seed torch's, numpy's and Python's global generators from stream `stream` of `seed` with
    `key` (`GLOBAL` with the rank for a training process, `WORKER` with the worker index for a
    sampler process)."""
    s = derive(seed, stream, *key)
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
