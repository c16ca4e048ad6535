"""One replay of K shards, one per writer whose rollouts must not interleave (actor hosts).

A `fnrl.replay` buffer keeps each env's rows in order, and a row's bootstrap observation is
the next row's (`fnrl.replay.buffer`), so two actors that step different envs cannot write
into the same env columns. Each actor k gets shard k, a `SharedReplay` of its own B columns
and capacity // K rows, written at its own pace:

    replay = ShardedReplay([SharedReplay(buffer_k, lock) for k in range(K)])
    replay.add(rollout, shard=k)                      # actor k's [T, B] rollout
    batch = replay.sample(batch_size, beta)           # TensorDict [batch_size] or None
    replay.update_priorities(batch["index"], td_error, sampled_at)

Sampling splits the batch evenly between the shards that can serve their share (the first
batch_size % K of them take one row more), so the batch keeps its size when a shard is still
filling or its actor is gone (its rows stay and are still drawn). With actors at equal speed
this is uniform over all rows; with prioritized shards it is stratified by shard, and the
importance weights are each shard's own (normalized within its part of the batch), as with
the sharded replay tables of Ape-X-style systems. `index` encodes the shard:
shard * rows_per_shard + the shard's index, so priorities find their way back.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

from fnrl.replay.shared import SharedReplay

__all__ = ["ShardedReplay"]


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

    def add(self, rollout: TensorDict, shard: int) -> None:
        """Write writer `shard`'s rollout [T, B] into its shard."""
        self.shards[shard].add(rollout)

    def sample(self, batch_size: int, beta: float | torch.Tensor = 0.4, *,
               generator: torch.Generator | None = None) -> TensorDict | None:
        """`batch_size` rows, split evenly between the shards that can serve their share; None
        while the shards together cannot."""
        ready = list(range(len(self.shards)))
        while ready:
            share = [batch_size // len(ready) + (i < batch_size % len(ready)) for i in range(len(ready))]
            able = [k for k, n in zip(ready, share) if self.shards[k].num_sampleable() >= n]
            if able == ready:
                break
            ready = able
        if not ready:
            return None
        parts = []
        for k, n in zip(ready, share):
            part = self.shards[k].sample(n, beta=beta, generator=generator)
            if part is None:   # the shard's count moved between the check and the draw
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
