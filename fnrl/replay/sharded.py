"""One replay of K shards, one per writer whose rollouts must not interleave (actor hosts).

A `fnrl.replay` buffer keeps each env's rows in order, and a row's bootstrap observation is
the next row's (`fnrl.replay.buffer`), so two actors that step different envs cannot write
into the same env columns. Each actor k gets shard k, a `SharedReplay` of its own B columns
and capacity // K rows, written at its own pace:

    replay = ShardedReplay([SharedReplay(buffer_k, lock) for k in range(K)])
    replay.add(rollout, shard=k)                      # actor k's [T, B] rollout
    batch = replay.sample(batch_size, beta)           # TensorDict [batch_size] or None
    replay.update_priorities(batch["index"], td_error, sampled_at)

Sampling splits the batch as evenly between the shards as their sampleable rows allow (`split`),
so the batch keeps its size when a shard is still filling or its actor is gone (its rows stay
and are still drawn). With actors at equal speed this is uniform over all rows; with
prioritized shards it is stratified by shard, and the importance weights are each shard's own
(normalized within its part of the batch). `index` encodes the shard: shard * stride + the
shard's own index (stride: the largest shard's row count), so priorities find their way back.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

from fnrl.replay.shared import SharedReplay

__all__ = ["ShardedReplay", "split"]


def split(batch_size: int, available: list[int]) -> list[int] | None:
    """Rows to draw from each shard: as even as the shards' sampleable rows `available` allow (a
    shard short of its even share gives all it has, the fuller ones the rest; where the split is
    uneven, the fuller shards take the extra rows); None if they hold fewer than `batch_size` in all.

        split(8, [10, 10]) == [4, 4];  split(8, [1, 10]) == [1, 7];  split(256, [127, 200]) == [127, 129]
    """
    if sum(available) < batch_size:
        return None
    sizes, left = [0] * len(available), batch_size
    order = sorted(range(len(available)), key=lambda k: (available[k], k))
    for i, k in enumerate(order):
        sizes[k] = min(available[k], left // (len(order) - i))
        left -= sizes[k]
    return sizes


class ShardedReplay:
    """K `SharedReplay` shards behind `SharedReplay`'s interface (module docstring)."""

    def __init__(self, shards: list[SharedReplay]):
        if not shards:
            raise ValueError("a sharded replay needs at least one shard")
        self.shards = shards
        self.stride = max(s.spec.rows_per_env * s.spec.num_envs for s in shards)

    @property
    def spec(self):
        return self.shards[0].spec

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.shards)

    def add(self, rollout: TensorDict, shard: int, priority: torch.Tensor | None = None) -> None:
        """Write writer `shard`'s rollout [T, B] into its shard (priority: `SharedReplay.add`'s)."""
        self.shards[shard].add(rollout, priority)

    def sample(self, batch_size: int, beta: float | torch.Tensor = 0.4, *,
               generator: torch.Generator | None = None) -> TensorDict | None:
        """`batch_size` rows, split as evenly between the shards as their sampleable rows allow
        (`split`); None while the shards together hold fewer."""
        sizes = split(batch_size, [s.num_sampleable() for s in self.shards])
        if sizes is None:
            return None
        parts = []
        for k, n in enumerate(sizes):
            if n == 0:
                continue
            part = self.shards[k].sample(n, beta=beta, generator=generator)
            if part is None:   # cannot happen while only `add` writes: rows only become sampleable
                return None
            part["index"] = part["index"] + k * self.stride
            parts.append(part)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    @property
    def steps_written(self) -> tuple[int, ...]:
        """Each shard's W (rows written per env), the token `update_priorities` takes."""
        return tuple(s.steps_written for s in self.shards)

    def update_priorities(self, index: torch.Tensor, priority: torch.Tensor,
                          sampled_at: tuple[int, ...] | None = None) -> None:
        """Route every row's new priority to its shard (see `SharedReplay.update_priorities`)."""
        index, priority = index.cpu(), priority.cpu()
        shard = torch.div(index, self.stride, rounding_mode="floor")
        for k in shard.unique().tolist():
            mine = shard == k
            self.shards[k].update_priorities(index[mine] - k * self.stride, priority[mine],
                                             None if sampled_at is None else sampled_at[k])

    def num_sampleable(self) -> int:
        return sum(s.num_sampleable() for s in self.shards)

    def snapshot(self) -> tuple:
        """Private deep copies of the shards' buffers (`SharedReplay.snapshot`), in shard order: what a
        checkpoint holds, and what `ShardedReplay([SharedReplay(b, lock) for b in ...])` resumes from."""
        return tuple(s.snapshot() for s in self.shards)
