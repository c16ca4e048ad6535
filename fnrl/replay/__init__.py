"""Replay buffers for [T, B] rollouts: uniform, prioritized, n-step, frame-deduplicated.

rlpyt's replay line in torch, with all state in tensors and TensorDicts.

API (functional in spirit: every call takes the buffer and returns the buffer to use next;
the big tensors are preallocated and updated in place, never copied):

    buffer = replay.init(example, capacity, *, num_envs=None, n_step=1, gamma=0.99,
                         prioritized=False, alpha=0.6, priority_eps=1e-6,
                         frame_dedup=False, device="cpu", memmap_dir=None)
    buffer = replay.add(buffer, rollout, compiled=False) # rollout: TensorDict [T, B]
    batch  = replay.sample(buffer, batch_size, beta=0.4, generator=None)   # TensorDict [N]
    buffer = replay.update_priorities(buffer, batch["index"], td_error)
    replay.size(buffer), replay.num_sampleable(buffer), replay.can_sample(buffer, batch_size)

For a graph that samples and learns in one call (`fnrl.learner`), `sample` and
`update_priorities` without their checks: `draw(buffer.spec, buffer.tree, buffer.storage,
batch_size, beta)` and `set_priorities(..., dedup=False)`.

Storage. Each env has its own time-major ring of C = capacity // B rows (TensorDict
[C, B]); absolute row a of an env (a = 0, 1, ... counted since `init`) lives at position
a % C. A rollout [T, B] (T <= C) is written with at most two slice copies at the cursor
W % C, W = rows written per env so far. Every key but `next_obs` is stored: under the
sampler's contract next_obs[t] == obs[t + 1] per env (also across resets, because the
reset step's row holds the finished episode's final observation), so row t's bootstrap
observation is the stored obs of row t + m. With `memmap_dir` the storage lives in
memory-mapped files (tensordict memmap), for buffers larger than RAM.

Which rows are sampled. Absolute row a of env b may be sampled iff
  1. valid[a, b] (never EnvPool's reset step);
  2. a <= W - 1 - n: rows a .. a+n are all written, so the whole window a .. a+m-1 and
     the bootstrap row a+m (m <= n) exist; i.e. the newest n rows of every env are never
     sampled. Windows run forward in time and the cursor only overwrites the oldest rows,
     so this also rules out windows that cross the cursor (overwritten mid-window);
  3. a >= W - C (still stored);
  4. frame_dedup only: every frame of its stack is still stored (a - S + 1 >= W - C, or
     the stack restarted within its last S - 1 rows).
Rows that break a rule have sum-tree leaf 0 (and keep their priority for later); `add`
recomputes exactly the rows whose status can change: the newest T + n rows and the
S - 1 oldest ones.

n-step targets are computed at sample time from the stored rewards: the window rows
t .. t+n-1 of the sampled env are gathered as [n, N] and passed to
`fnrl.returns.n_step_returns(reward, gamma * (1 - terminated), done, n)`; row 0 gives the
n-step return, the bootstrap discount (gamma^m, 0 after a termination) and m.

Prioritized replay (Schaul et al. 2016, arXiv:1511.05952) uses a flat vectorized sum tree
(`fnrl.replay.sum_tree`): batched leaf writes fix parents level by level, and a batch of N
stratified draws descends the tree level by level together. Priorities are stored as
p = (|delta| + eps)^alpha; new rows get the largest p so far (1 at first); importance
weights w_i = (N_valid P(i))^-beta / max w are normalised by the max over the batch, as in
rlpyt, which reduces to (min_batch p / p_i)^beta. Anneal beta by passing it per call.
A uniform buffer is the same tree with every priority 1, drawn without stratification.

Frame deduplication (`frame_dedup=True`, EnvPool Atari uint8 [S, H, W] stacks) stores only
the newest frame of each row (S times less memory) and rebuilds obs and next_obs stacks
exactly as EnvPool 1.2.5 builds them: see `fnrl.replay.frames`.
"""
from fnrl.replay.buffer import (ReplayBuffer, ReplaySpec, add, can_sample, clone, draw, init, num_sampleable,
                                prepare_write, sample, set_priorities, size, update_priorities)
from fnrl.replay import sequence  # sequence replay for recurrent agents (R2D1): fnrl.replay.sequence

__all__ = ["ReplayBuffer", "ReplaySpec", "init", "add", "sample", "draw", "update_priorities", "set_priorities",
           "size", "num_sampleable", "can_sample", "clone", "prepare_write", "sequence"]
