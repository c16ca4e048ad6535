"""A replay buffer in shared memory: one writer process, readers in other processes.

    shared = SharedReplay(replay.init(example, capacity, ...), lock=ctx.RLock())
    # pass `shared` to a process started from `ctx` (spawn, fork or forkserver):
    shared.add(rollout)                          # writer: [T, B] rows, under the lock
    batch = shared.sample(batch_size, beta)      # reader: a copy [N], or None if too few rows
    shared.update_priorities(batch["index"], td_error)

Every tensor of the `fnrl.replay` buffer (storage, row table, sum tree, max priority,
sampleable count) is moved to shared memory (`share_memory_()`); the only state the
buffer keeps outside tensors, W = rows written per env, becomes a shared int64 scalar.

Consistency rule (no torn batch). `add` writes the rows, refreshes the sampleable flags
and tree leaves, and publishes the new W, all while holding the lock; `sample` draws the
rows and gathers them into new tensors (a copy) while holding it; `update_priorities`
writes the tree under it too. So a reader never sees a row whose write is in progress,
a row that became sampleable before its n-step window and bootstrap row were written,
or a tree whose inner sums disagree with its leaves: it sees the buffer exactly as it
was between two `add`s. The writer holds the lock for one rollout copy (T x B rows) and
the reader for one gather of N rows, so neither waits long.

The lock is a `multiprocessing` lock from the context the processes are started with;
an RLock lets a caller hold it around several calls (e.g. `sample` and `steps_written`).
The async sampler wraps it in `fnrl.samplers.async_.TimedLock`, so a process never
waits forever on a lock that a killed process still holds.
Storage must live on the CPU (not memory-mapped): shared memory is host memory. The
optimizer moves a sample to its device after `sample` returns.
"""
from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict

from fnrl.replay import buffer as replay
from fnrl.replay import snapshot
from fnrl.replay.buffer import ReplayBuffer

__all__ = ["SharedReplay"]


class SharedReplay:
    """A `fnrl.replay` buffer whose tensors live in shared memory, guarded by `lock`.

    buffer: a buffer from `fnrl.replay.init` on the CPU (it may already hold rows); its
    tensors are moved to shared memory in place. lock: a `multiprocessing` Lock or RLock.
    The object pickles to a process started by multiprocessing (the tensors travel as
    shared-memory handles, the lock as itself), so writer and readers see one buffer.
    """

    def __init__(self, buffer: ReplayBuffer, lock):
        if buffer.spec.device.type != "cpu":
            raise ValueError(f"a shared replay lives in host memory; init the buffer with device='cpu', "
                             f"not {buffer.spec.device}")
        if buffer.storage.is_memmap():
            raise ValueError("a memory-mapped buffer cannot be shared this way; init it without memmap_dir")
        for t in (buffer.tree, buffer.max_priority, buffer.sampleable_count):
            t.share_memory_()
        buffer.storage.share_memory_()
        buffer.rows.share_memory_()
        self._buffer = buffer
        self._steps_written = torch.tensor(buffer.steps_written, dtype=torch.int64).share_memory_()
        self.lock = lock

    @property
    def spec(self) -> replay.ReplaySpec:
        return self._buffer.spec

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer's tensors."""
        return snapshot.nbytes(self._buffer)

    def _current(self) -> ReplayBuffer:
        return dataclasses.replace(self._buffer, steps_written=int(self._steps_written))

    def add(self, rollout: TensorDict, priority: torch.Tensor | None = None) -> None:
        """Write a rollout [T, B] (see `fnrl.replay.add`); rows, flags, tree and W change together.

        priority: TD errors [T, B] computed by the writer (Ape-X's actors,
        `fnrl.algos.dqn.initial_priorities`) for the rows W - n .. W + T - 1 - n, W the rows
        written per env before this rollout: the rows whose n-step windows it completes. They
        replace `max_priority` in the same locked step (NaN entries, and rows before the first,
        are left as they are)."""
        with self.lock:
            current = self._current()
            written = replay.add(current, rollout)
            if priority is not None:
                self._set_written_priorities(current.steps_written, priority)
            self._steps_written.fill_(written.steps_written)

    def _set_written_priorities(self, before: int, priority: torch.Tensor) -> None:
        spec = self.spec
        T, B = priority.shape
        row = torch.arange(before - spec.n_step, before - spec.n_step + T)
        keep = (row >= 0).unsqueeze(1) & ~priority.isnan()
        index = (row % spec.rows_per_env).unsqueeze(1) * B + torch.arange(B)
        replay.update_priorities(self._buffer, index[keep], priority[keep])

    def sample(self, batch_size: int, beta: float | torch.Tensor = 0.4, *,
               generator: torch.Generator | None = None) -> TensorDict | None:
        """A copy of `batch_size` rows drawn as `fnrl.replay.sample` draws them, or None while
        fewer than `batch_size` rows are sampleable. The TensorDict [N] shares no memory
        with the buffer, so later writes cannot change it."""
        with self.lock:
            current = self._current()
            if not replay.can_sample(current, batch_size):
                return None
            return replay.sample(current, batch_size, beta=beta, generator=generator)

    def update_priorities(self, index: torch.Tensor, priority: torch.Tensor, sampled_at: int | None = None) -> None:
        """`fnrl.replay.update_priorities` under the lock (index from `sample`, priority = TD errors [N]).

        sampled_at: `steps_written` read before the `sample` that drew `index`: rows written over
        since then (the writer runs in another process) are left as they are, so a new row never
        takes the priority of the old one it replaced."""
        with self.lock:
            if sampled_at is not None:
                fresh = ~self._overwritten(index, sampled_at)
                index, priority = index[fresh], priority[fresh]
            replay.update_priorities(self._buffer, index.cpu(), priority.cpu())

    def _overwritten(self, index: torch.Tensor, sampled_at: int) -> torch.Tensor:
        """bool [N]: whether flat row `index` (position * B + env) was written since `sampled_at`.
        The writes since then went to positions sampled_at, sampled_at + 1, ... mod C."""
        spec, since = self.spec, int(self._steps_written) - sampled_at
        position = torch.div(index, spec.num_envs, rounding_mode="floor")
        return (position - sampled_at) % spec.rows_per_env < since

    @property
    def steps_written(self) -> int:
        """W: rows written per env so far (published after the rows)."""
        return int(self._steps_written)

    def num_sampleable(self) -> int:
        """Rows `sample` may return now (one shared scalar, read without the lock)."""
        return int(self._buffer.sampleable_count)

    def snapshot(self) -> ReplayBuffer:
        """A private deep copy of the buffer as it is between two writes (for checks and tests)."""
        with self.lock:
            return replay.clone(self._current())
