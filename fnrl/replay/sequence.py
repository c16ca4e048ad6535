"""Sequence replay for recurrent agents (R2D2, Kapturowski et al. 2019; rlpyt's R2D1 buffer).

    buffer = sequence.init(example, capacity, burn_in=40, seq_len=80, n_step=5, carry_interval=40,
                           prioritized=True, alpha=0.9, frame_dedup=False, device="cpu")
    buffer = sequence.add(buffer, rollout, priority=None)    # rollout: TensorDict [T, B]
    batch  = sequence.sample(buffer, batch_size, beta=0.6)    # TensorDict [L, N], L = burn_in + seq_len + n_step
    buffer = sequence.update_priorities(buffer, batch["index"][0], priority)
    sequence.num_sampleable(buffer), sequence.can_sample(buffer, batch_size)

Storage. Rows live in one time-major ring per env, as in `fnrl.replay.buffer`: C = capacity
// B rows per env, absolute row a of an env (counted since `init`) at position a % C. Every
rollout key is stored except `next_obs` (next_obs[t] == obs[t + 1]), `carry` and
`carry0`. The recurrent state is kept only every k = `carry_interval` rows: the rollout's
per-step `carry` (the carry `act` received at that step, `extras["carry"]`) of absolute
rows a with a % k == 0 goes into a second ring [C / k, B] (C must be a multiple of k).

Sequences. A sequence starts at a row a with a % k == 0 (its "slot" is (a / k) % (C / k))
and covers the L = burn_in + seq_len + n_step rows a .. a + L - 1: burn_in rows to warm
the recurrent state up (no gradient), seq_len trained rows, and n_step more rows that
only provide the bootstrap targets of the last trained rows. A sequence may be sampled
iff all its rows are written and still stored:

    W - C <= a    and    a + L <= W          (W = rows written per env so far),

so no sequence ever crosses the write cursor; with frame deduplication its first row's
frame stack must also still be stored. `add` rechecks exactly the slots whose status can
change (the starts in [W - L, W + T) and, for frame stacks, the oldest S - 1 rows).

A sample is a TensorDict [L, N] (time-major) holding every stored key of the rows, plus
- `reset` [L, N] bool: the carry is zeroed before the row (the rollout's own `reset` if
  it has one, else reset[a] = not valid[a - 1], the first row ever included; see
  fnrl.nets.recurrent);
- `mask` [L, N] bool: the rows a loss may use: trained rows (burn_in <= t < burn_in +
  seq_len) that are valid and come before any episode end inside the trained part
  (a done at trained row t masks rows t + 1 ...; the done row itself stays);
- per-sequence entries broadcast along time as stride-0 views (read them at [0]):
  `carry` (the stored carry at the first row, TensorDict [N]; absent when the rollouts
  hold no carry), `weight` (importance weight), `index` (int64, for `update_priorities`).

Priorities (Schaul et al. 2016) belong to sequences: one sum-tree leaf per (slot, env),
leaf slot * B + env. A priority p given at insertion (`add(..., priority)`, e.g. R2D2's
eta max|td| + (1 - eta) mean|td| from the actor's Q-values) or by `update_priorities` is
stored as (p + eps)^alpha; without one, new sequences get the largest stored value so far
(1 at first). Importance weights are (min_batch P / P_i)^beta, as in `fnrl.replay`.

Frame deduplication (`frame_dedup=True`, uint8 Atari stacks [S, H, W]) stores the newest
frame of each row only and rebuilds every row's stack at sample time exactly as
`fnrl.replay.frames` describes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

from fnrl.checks import check_bool, check_float, check_shape
# size (rows stored), num_sampleable (sequences `sample` may return) and can_sample read the
# same fields of both buffers
from fnrl.replay.buffer import can_sample, num_sampleable, set_priorities, size
from fnrl.replay.frames import stack_source_rows, stack_starts
from fnrl.replay.sum_tree import sum_tree_get, sum_tree_init, sum_tree_sample, sum_tree_set

__all__ = ["SequenceSpec", "SequenceBuffer", "init", "add", "sample", "update_priorities", "size",
           "num_sampleable", "can_sample"]

REQUIRED_KEYS = ("obs", "action", "reward", "terminated", "done", "valid")
NOT_STORED = ("next_obs", "carry", "carry0")
SAMPLE_KEYS = ("mask", "weight", "index")


@dataclass(frozen=True)
class SequenceSpec:
    """Static configuration (Python values): C rows per env, B envs, the sequence layout
    (burn_in, seq_len, n_step), the carry interval k, priority settings, frame stack S."""
    rows_per_env: int
    num_envs: int
    burn_in: int
    seq_len: int
    n_step: int
    carry_interval: int
    prioritized: bool
    alpha: float
    priority_eps: float
    frame_stack: int
    device: torch.device

    @property
    def length(self) -> int:
        """L = burn_in + seq_len + n_step rows per sampled sequence."""
        return self.burn_in + self.seq_len + self.n_step

    @property
    def slots(self) -> int:
        """Sequence starts kept per env: C / k."""
        return self.rows_per_env // self.carry_interval

    @property
    def frame_dedup(self) -> bool:
        return self.frame_stack > 1


@dataclass(frozen=True)
class SequenceBuffer:
    """Preallocated tensors (mutated in place by `add` / `update_priorities`) + the cursor.

    storage: TensorDict [C, B] of the stored rows (+ `reset`; obs holds only the newest
      frame when frame-deduplicated). carry: TensorDict [C / k, B] of stored carries, or None.
    slots: TensorDict [C / k, B]: `priority` (stored p^alpha) and `sampleable` per sequence.
    stack_start: bool [C, B] frame-stack restarts (frame_dedup), else None.
    tree: the sum tree over the C / k * B sequences. max_priority: float32 []; sampleable_count:
    int64 []. last_valid: bool [B], valid of each env's newest row (for computed resets).
    steps_written: W, rows written per env so far (Python int).
    """
    spec: SequenceSpec
    storage: TensorDictBase
    carry: TensorDictBase | None
    slots: TensorDict
    stack_start: torch.Tensor | None
    tree: torch.Tensor
    max_priority: torch.Tensor
    sampleable_count: torch.Tensor
    last_valid: torch.Tensor
    steps_written: int = 0


def _example_row(example: TensorDictBase) -> TensorDictBase:
    if not isinstance(example, TensorDictBase) or example.batch_dims != 2:
        raise ValueError("example must be a TensorDict rollout with batch_size [T, B], got "
                         f"{type(example).__name__} {getattr(example, 'batch_size', '')}")
    missing = [k for k in REQUIRED_KEYS if k not in example.keys()]
    if missing:
        raise ValueError(f"example lacks the keys {missing}; a rollout needs {list(REQUIRED_KEYS)}")
    reserved = [k for k in SAMPLE_KEYS if k in example.keys()]
    if reserved:
        raise ValueError(f"example keys {reserved} clash with the keys a sample adds {list(SAMPLE_KEYS)}")
    row = example[0, 0]
    check_float(reward=row["reward"])
    check_bool(terminated=row["terminated"], done=row["done"], valid=row["valid"])
    for key in ("reward", "terminated", "done", "valid"):
        check_shape(key, row[key], (), "[] per row (rollout [T, B])")
    if "reset" in row.keys():
        check_bool(reset=row["reset"])
    return row


def init(example: TensorDictBase, capacity: int, *, burn_in: int, seq_len: int, n_step: int = 1,
         carry_interval: int | None = None, prioritized: bool = False, alpha: float = 0.6,
         priority_eps: float = 1e-6, frame_dedup: bool = False,
         device: str | torch.device = "cpu") -> SequenceBuffer:
    """An empty buffer of `capacity` rows (capacity // B per env) shaped like rollout `example` [T, B].

    burn_in, seq_len, n_step: the sequence layout (L = burn_in + seq_len + n_step rows).
    carry_interval: k, rows between stored carries and sequence starts (default seq_len);
    capacity // B must be a multiple of k and hold a sequence plus one rollout.
    """
    row = _example_row(example)
    T, B = example.batch_size
    k = seq_len if carry_interval is None else carry_interval
    if min(seq_len, n_step, k) < 1 or burn_in < 0:
        raise ValueError(f"need seq_len, n_step, carry_interval >= 1 and burn_in >= 0; got seq_len={seq_len}, "
                         f"n_step={n_step}, carry_interval={k}, burn_in={burn_in}")
    C = capacity // B
    frame_stack = 1
    stored = row.exclude(*NOT_STORED)
    if frame_dedup:
        obs = stored["obs"]
        if not torch.is_tensor(obs) or obs.dtype != torch.uint8 or obs.ndim != 3:
            raise ValueError("frame_dedup needs obs to be uint8 frame stacks [S, H, W], got "
                             f"{getattr(obs, 'dtype', type(obs).__name__)} {tuple(getattr(obs, 'shape', ()))}")
        frame_stack = obs.shape[0]
        stored.set("obs", obs[-1])
    L = burn_in + seq_len + n_step
    need = L + max(T, k) + frame_stack - 1
    if C % k != 0 or C < need:
        raise ValueError(f"capacity={capacity} keeps {C} rows per env; it must be a multiple of carry_interval={k} "
                         f"and at least {need} (a sequence of {L} rows plus a rollout of {T}"
                         f"{' and a frame stack' if frame_dedup else ''}); e.g. capacity={-(-need // k) * k * B}")
    if alpha < 0 or priority_eps < 0:
        raise ValueError(f"need alpha >= 0 and priority_eps >= 0, got {alpha}, {priority_eps}")
    device = torch.device(device)
    if "reset" not in stored.keys():
        stored.set("reset", torch.zeros((), dtype=torch.bool))
    storage = stored.apply(lambda x: torch.zeros((C, B, *x.shape), dtype=x.dtype, device=device),
                           batch_size=[C, B], device=device)
    carry = None
    if "carry" in row.keys():
        carry = row["carry"].apply(lambda x: torch.zeros((C // k, B, *x.shape), dtype=x.dtype, device=device),
                                   batch_size=[C // k, B], device=device)
    slots = TensorDict({"priority": torch.ones(C // k, B, device=device),
                        "sampleable": torch.zeros(C // k, B, dtype=torch.bool, device=device)},
                       batch_size=[C // k, B], device=device)
    spec = SequenceSpec(rows_per_env=C, num_envs=B, burn_in=burn_in, seq_len=seq_len, n_step=n_step,
                        carry_interval=k, prioritized=prioritized, alpha=float(alpha),
                        priority_eps=float(priority_eps), frame_stack=frame_stack, device=device)
    return SequenceBuffer(spec=spec, storage=storage, carry=carry, slots=slots,
                          stack_start=torch.zeros(C, B, dtype=torch.bool, device=device) if frame_dedup else None,
                          tree=sum_tree_init((C // k) * B, device), max_priority=torch.ones((), device=device),
                          sampleable_count=torch.zeros((), dtype=torch.int64, device=device),
                          last_valid=torch.zeros(B, dtype=torch.bool, device=device))


def _write_ring(dest, data, start: int) -> None:
    """dest[(start + t) % C] = data[t] for t < T (T <= C), as at most two slice writes."""
    C, T = dest.shape[0], data.shape[0]
    first = min(T, C - start)
    dest[start:start + first] = data[:first]
    if first < T:
        dest[:T - first] = data[first:]


def _oldest(spec: SequenceSpec, steps_written: int) -> int:
    return max(0, steps_written - spec.rows_per_env)


def _check_rollout(buffer: SequenceBuffer, rollout: TensorDictBase) -> None:
    spec = buffer.spec
    if not isinstance(rollout, TensorDictBase) or rollout.batch_dims != 2:
        raise ValueError(f"rollout must be a TensorDict with batch_size [T, B], got "
                         f"{type(rollout).__name__} {getattr(rollout, 'batch_size', '')}")
    T, B = rollout.batch_size
    if B != spec.num_envs or T > spec.rows_per_env:
        raise ValueError(f"rollout [T={T}, B={B}] does not fit a buffer of {spec.rows_per_env} rows for "
                         f"{spec.num_envs} envs")
    if (buffer.carry is None) != ("carry" not in rollout.keys()):
        raise ValueError("rollout and buffer disagree on `carry`: either every rollout holds the per-step "
                         "carry (extras['carry']) or none does")
    data = rollout.exclude(*NOT_STORED)
    stored = set(buffer.storage.keys(include_nested=True, leaves_only=True))
    given = set(data.keys(include_nested=True, leaves_only=True)) | {"reset"}
    if stored != given:
        raise ValueError(f"rollout keys differ from the buffer's: missing {sorted(map(str, stored - given))}, "
                         f"unexpected {sorted(map(str, given - stored))}")


def _refresh(buffer: SequenceBuffer, start: torch.Tensor, steps_written: int) -> None:
    """Recompute `sampleable`, its count and the leaves of the distinct sequence starts `start` [K]
    (absolute rows, multiples of k, all occupying their slot)."""
    spec = buffer.spec
    oldest = _oldest(spec, steps_written)
    ok = ((start >= oldest) & (start + spec.length <= steps_written)).unsqueeze(1).expand(-1, spec.num_envs)
    if spec.frame_dedup:
        env = torch.arange(spec.num_envs, device=start.device)
        sources = stack_source_rows(start.unsqueeze(1), env, buffer.stack_start, oldest, spec.frame_stack)
        ok = ok & (sources[..., 0] >= oldest)
    slot = torch.div(start, spec.carry_interval, rounding_mode="floor") % spec.slots
    old = buffer.slots["sampleable"][slot]
    buffer.sampleable_count.add_(ok.sum() - old.sum())
    buffer.slots["sampleable"][slot] = ok
    leaf = (slot.unsqueeze(1) * spec.num_envs + torch.arange(spec.num_envs, device=start.device)).flatten()
    sum_tree_set(buffer.tree, leaf, (buffer.slots["priority"][slot] * ok).flatten())


def _starts_in(spec: SequenceSpec, lo: int, hi: int) -> torch.Tensor:
    """Sequence starts (multiples of k) in [max(lo, 0), hi)."""
    k = spec.carry_interval
    first = -(-max(lo, 0) // k) * k
    return torch.arange(first, max(hi, first), k, device=spec.device)


def add(buffer: SequenceBuffer, rollout: TensorDictBase, priority: torch.Tensor | None = None) -> SequenceBuffer:
    """Write a rollout [T, B] at the cursor and return the buffer.

    The rollout's per-step `carry` of the rows a with a % k == 0 is stored. priority:
    None (new sequences get `max_priority`), [B] (every sequence starting in this rollout
    gets its env's value) or [T, B] (the sequence starting at row t gets priority[t]):
    raw priorities p >= 0, stored as (p + eps)^alpha. Sequences become sampleable once
    their last row is written.
    """
    _check_rollout(buffer, rollout)
    spec, W = buffer.spec, buffer.steps_written
    C, k, (T, B) = spec.rows_per_env, spec.carry_interval, rollout.batch_size
    data = rollout.exclude(*NOT_STORED).to(spec.device)
    if "reset" not in data.keys():
        previous_valid = buffer.last_valid if W > 0 else torch.zeros(B, dtype=torch.bool, device=spec.device)
        data.set("reset", ~torch.cat([previous_valid.unsqueeze(0), data["valid"][:-1]]))
    if spec.frame_dedup:
        obs = data["obs"]
        previous_valid = buffer.last_valid if W > 0 else torch.zeros(B, dtype=torch.bool, device=spec.device)
        follows_reset = ~torch.cat([previous_valid.unsqueeze(0), data["valid"][:-1]])
        _write_ring(buffer.stack_start, stack_starts(obs, follows_reset), W % C)
        data.set("obs", obs[:, :, -1])
    _write_ring(buffer.storage, data, W % C)
    buffer.last_valid.copy_(data["valid"][-1])

    new_starts = _starts_in(spec, W, W + T)
    slot = torch.div(new_starts, k, rounding_mode="floor") % spec.slots
    if buffer.carry is not None and new_starts.numel():
        buffer.carry[slot] = rollout["carry"][new_starts - W].to(spec.device)
    if priority is None:
        buffer.slots["priority"][slot] = buffer.max_priority
    elif new_starts.numel():
        priority = priority.detach().to(spec.device, torch.float32)
        if priority.shape not in ((B,), (T, B)):
            raise ValueError(f"priority must be [B] or [T, B] = [{T}, {B}], got {tuple(priority.shape)}")
        p = priority.expand(new_starts.numel(), B) if priority.ndim == 1 else priority[new_starts - W]
        p = (p.abs() + spec.priority_eps) ** spec.alpha
        buffer.slots["priority"][slot] = p
        buffer.max_priority.copy_(torch.maximum(buffer.max_priority, p.max()))

    steps = W + T
    oldest = _oldest(spec, steps)
    changed = torch.cat([_starts_in(spec, W - spec.length, steps),
                         _starts_in(spec, oldest, oldest + spec.frame_stack - 1)]).unique()
    _refresh(buffer, changed, steps)
    return dataclasses.replace(buffer, steps_written=steps)


def _stacked_frames(buffer: SequenceBuffer, row: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
    """uint8 stacks [L, N, S, H, W] of absolute rows `row` [L, N] of envs `env` [N]."""
    spec = buffer.spec
    sources = stack_source_rows(row, env, buffer.stack_start, _oldest(spec, buffer.steps_written), spec.frame_stack)
    flat = (sources % spec.rows_per_env) * spec.num_envs + env.unsqueeze(-1)       # [L, N, S]
    frames = buffer.storage["obs"].flatten(0, 1)                                   # [C B, H, W]
    return frames.index_select(0, flat.flatten()).view(*flat.shape, *frames.shape[1:])


def trained_mask(valid: torch.Tensor, done: torch.Tensor, burn_in: int, seq_len: int) -> torch.Tensor:
    """Rows of a sequence a loss may use: bool [L, N].

    mask_t = valid_t and burn_in <= t < burn_in + seq_len and no done at rows burn_in .. t-1.
    valid, done: bool [L, N].
    """
    trained = slice(burn_in, burn_in + seq_len)
    ended_before = torch.cumsum(done[trained].long(), 0) - done[trained].long() > 0
    mask = torch.zeros_like(valid)
    mask[trained] = valid[trained] & ~ended_before
    return mask


def sample(buffer: SequenceBuffer, batch_size: int, beta: float | torch.Tensor = 0.4, *,
           generator: torch.Generator | None = None) -> TensorDict:
    """Draw `batch_size` sampleable sequences (with replacement); returns a TensorDict [L, N].

    Uniform buffers draw sequences independently and uniformly; prioritized ones draw one
    per stratum with P(i) = p_i / sum_k p_k and weight w_i = (min_j p_j / p_i)^beta over the
    batch. See the module docstring for the keys.
    """
    spec = buffer.spec
    available = num_sampleable(buffer)
    if available < batch_size:
        raise ValueError(f"only {available} sampleable sequences for batch_size={batch_size}; add more rollouts "
                         f"first (check with can_sample)")
    C, B, L, k = spec.rows_per_env, spec.num_envs, spec.length, spec.carry_interval
    index = sum_tree_sample(buffer.tree, batch_size, stratified=spec.prioritized, generator=generator)
    slot, env = torch.div(index, B, rounding_mode="floor"), index % B
    offset = torch.arange(L, device=index.device).unsqueeze(1)
    position = (slot * k + offset) % C                                                # [L, N]
    batch = buffer.storage.exclude("obs")[position, env]
    if spec.frame_dedup:
        start = slot * k + C * torch.div(buffer.steps_written - 1 - slot * k, C, rounding_mode="floor")
        batch.set("obs", _stacked_frames(buffer, start + offset, env))
    else:
        batch.set("obs", buffer.storage.get("obs")[position, env])
    batch.set("mask", trained_mask(batch["valid"], batch["done"], spec.burn_in, spec.seq_len))
    if spec.prioritized:
        p = sum_tree_get(buffer.tree, index)
        weight = (p.min() / p) ** torch.as_tensor(beta, dtype=p.dtype, device=index.device)
    else:
        weight = torch.ones(batch_size, dtype=torch.float64, device=index.device)
    batch.set("weight", weight.to(batch["reward"].dtype).expand(L, batch_size))
    batch.set("index", index.expand(L, batch_size))
    if buffer.carry is not None:
        batch.set("carry", buffer.carry[slot, env].expand(L, batch_size))
    return batch


def update_priorities(buffer: SequenceBuffer, index: torch.Tensor, priority: torch.Tensor) -> SequenceBuffer:
    """Set the priorities of sampled sequences: index int64 [N] (`batch["index"][0]`), priority [N]
    raw values (e.g. eta max|td| + (1 - eta) mean|td|), stored as (|p| + eps)^alpha."""
    set_priorities(buffer.spec, buffer.tree, buffer.slots, buffer.max_priority, index, priority)
    return buffer
