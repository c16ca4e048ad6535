"""R independent replay buffers side by side: the replay of a vmapped run (fnrl.seeds).

A vmapped run trains R rows (seeds or hyperparameter settings) on one pool of R x B envs;
row r steps envs r*B .. (r+1)*B - 1. Each row keeps its own `fnrl.replay` buffer of those
B env columns, made with its own gamma, so its contents, its sampleable rows and its
priorities are exactly those of the single run the row stands for. The API mirrors
`fnrl.replay` with a leading row axis on samples:

    buffers = multi.init(rollout, capacity, num_rows=R, gamma=[0.99] * R, n_step=3, ...)
    buffers = multi.add(buffers, rollout)                    # rollout [T, R * B]
    batch = multi.sample(buffers, batch_size, beta)          # TensorDict [R, N]: row r from buffer r
    buffers = multi.update_priorities(buffers, batch["index"], td_error)   # [R, N] each
    multi.can_sample(buffers, batch_size)                    # every row can

`capacity` is per row (each row is a single run with that buffer size). Sampling draws
each row's batch with `fnrl.replay.sample` (one compiled graph shared by all rows with
`compiled=True`) and stacks them.

Sequence replay (recurrent agents, R2D1) works the same way with one `fnrl.replay.sequence`
buffer per row:

    buffers = multi.init_sequence(rollout, capacity, num_rows=R, burn_in=..., seq_len=..., ...)
    buffers = multi.add(buffers, rollout, priority)          # priority [R * B] or [T, R * B] or None
    batch = multi.sample(buffers, batch_size, beta)          # TensorDict [R, L, N]
    buffers = multi.update_priorities(buffers, batch["index"], priority)   # index [R, L, N], priority [R, N]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from tensordict import TensorDictBase

from fnrl.replay import buffer as replay
from fnrl.replay import sequence

__all__ = ["MultiBuffer", "init", "init_sequence", "add", "sample", "update_priorities", "can_sample", "size", "row_columns"]


@dataclass(frozen=True)
class MultiBuffer:
    """R replay buffers (`fnrl.replay` or `fnrl.replay.sequence` ones); buffer r holds env
    columns r*B .. (r+1)*B - 1 of the rollouts."""

    buffers: tuple

    @property
    def kind(self):
        """The module of the row buffers: fnrl.replay.buffer or fnrl.replay.sequence."""
        return sequence if isinstance(self.buffers[0], sequence.SequenceBuffer) else replay

    @property
    def num_rows(self) -> int:
        return len(self.buffers)

    @property
    def num_envs(self) -> int:
        """B, envs per row."""
        return self.buffers[0].spec.num_envs


def row_columns(rollout: TensorDictBase, r: int, num_envs: int) -> TensorDictBase:
    """Row r's part [T, B] of a rollout [T, R * B] (a view): env columns r*B .. (r+1)*B - 1."""
    return rollout[:, r * num_envs:(r + 1) * num_envs]


def init(example: TensorDictBase, capacity: int, *, num_rows: int, gamma: float | Sequence[float] = 0.99,
         **options) -> MultiBuffer:
    """R empty buffers of `capacity` rows each for an example rollout [T, R * B].

    gamma: one discount for all rows or one per row (a swept gamma lives in the replay,
    which computes the n-step returns). options: those of `fnrl.replay.init` (n_step,
    prioritized, alpha, frame_dedup, device, ...), the same for every row.
    """
    if example.batch_dims != 2 or example.batch_size[1] % num_rows:
        raise ValueError(f"example must be a rollout [T, R * B] with R={num_rows}, got {example.batch_size}")
    gammas = [float(gamma)] * num_rows if isinstance(gamma, (int, float)) else [float(g) for g in gamma]
    if len(gammas) != num_rows:
        raise ValueError(f"got {len(gammas)} discounts for {num_rows} rows")
    B = example.batch_size[1] // num_rows
    return MultiBuffer(tuple(replay.init(row_columns(example, r, B), capacity, gamma=g, **options)
                             for r, g in enumerate(gammas)))


def init_sequence(example: TensorDictBase, capacity: int, *, num_rows: int, **options) -> MultiBuffer:
    """R empty `fnrl.replay.sequence` buffers of `capacity` rows each for an example rollout [T, R * B].

    options: those of `fnrl.replay.sequence.init` (burn_in, seq_len, n_step, carry_interval,
    prioritized, alpha, frame_dedup, device), the same for every row.
    """
    if example.batch_dims != 2 or example.batch_size[1] % num_rows:
        raise ValueError(f"example must be a rollout [T, R * B] with R={num_rows}, got {example.batch_size}")
    B = example.batch_size[1] // num_rows
    return MultiBuffer(tuple(sequence.init(row_columns(example, r, B), capacity, **options) for r in range(num_rows)))


def add(buffers: MultiBuffer, rollout: TensorDictBase, priority: torch.Tensor | None = None, *,
        compiled: bool = False, ahead_of_time: bool = False) -> MultiBuffer:
    """Add each row's env columns of `rollout` [T, R * B] to its own buffer (`compiled`,
    `ahead_of_time`: as in `fnrl.replay.add`, for plain buffers).

    priority (sequence buffers only): None, [R * B] or [T, R * B], the input priorities of
    `fnrl.replay.sequence.add`; row r gets its columns r*B .. (r+1)*B - 1.
    """
    if rollout.batch_dims != 2 or rollout.batch_size[1] != buffers.num_rows * buffers.num_envs:
        raise ValueError(f"rollout must be [T, {buffers.num_rows * buffers.num_envs}] "
                         f"(R={buffers.num_rows} rows of B={buffers.num_envs} envs), got {rollout.batch_size}")
    B = buffers.num_envs
    if buffers.kind is replay:
        if priority is not None:
            raise ValueError("input priorities are for sequence buffers (multi.init_sequence)")
        return MultiBuffer(tuple(replay.add(buf, row_columns(rollout, r, B), compiled=compiled,
                                            ahead_of_time=ahead_of_time)
                                 for r, buf in enumerate(buffers.buffers)))
    return MultiBuffer(tuple(
        sequence.add(buf, row_columns(rollout, r, B), None if priority is None else priority[..., r * B:(r + 1) * B])
        for r, buf in enumerate(buffers.buffers)))


def can_sample(buffers: MultiBuffer, batch_size: int) -> bool:
    """Whether every row has at least `batch_size` sampleable rows."""
    counts = torch.stack([buf.sampleable_count for buf in buffers.buffers])
    return bool((counts >= batch_size).all())


def sample(buffers: MultiBuffer, batch_size: int, beta: float | torch.Tensor = 0.4, *,
           compiled: bool = False) -> TensorDictBase:
    """One batch per row, stacked: TensorDict [R, N]; batch[r] is `fnrl.replay.sample` of buffer r
    (keys, n-step targets and importance weights as there; `index` indexes buffer r).
    Sequence buffers: TensorDict [R, L, N], batch[r] is `fnrl.replay.sequence.sample` of buffer r
    (`compiled` is ignored)."""
    if buffers.kind is sequence:
        return torch.stack([sequence.sample(buf, batch_size, beta) for buf in buffers.buffers])
    return torch.stack([replay.sample(buf, batch_size, beta, compiled=compiled) for buf in buffers.buffers])


def update_priorities(buffers: MultiBuffer, index: torch.Tensor, priority: torch.Tensor) -> MultiBuffer:
    """Row r's sampled rows `index[r]` [N] get priorities from TD errors `priority[r]` [N].
    Sequence buffers: index [R, L, N] (a sample's `index`, read at [:, 0]) or [R, N]; priority
    [R, N], one per sequence."""
    if buffers.kind is sequence and index.ndim == 3:
        index = index[:, 0]
    if index.shape != priority.shape or index.ndim != 2 or index.shape[0] != buffers.num_rows:
        raise ValueError(f"index and priority must both be [R={buffers.num_rows}, N]; got "
                         f"{tuple(index.shape)} and {tuple(priority.shape)}")
    return MultiBuffer(tuple(buffers.kind.update_priorities(buf, i, p) for buf, i, p in zip(buffers.buffers, index,
                                                                                             priority)))


def size(buffers: MultiBuffer) -> int:
    """Rows stored in all buffers together."""
    return sum(replay.size(buf) for buf in buffers.buffers)
