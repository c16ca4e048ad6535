"""Replay buffers over [T, B] rollouts: uniform, prioritized, n-step, frame-deduplicated.

See the package docstring (`fnrl.replay`) for the API, the sampleable-row rule and the
memory layout.
"""
from __future__ import annotations

import dataclasses
import functools
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

from fnrl.accel import aot
from fnrl.checks import check_bool, check_float, check_shape
from fnrl.replay.frames import stack_source_rows, stack_starts
from fnrl.replay.sum_tree import sum_tree_get, sum_tree_init, sum_tree_sample, sum_tree_set
from fnrl.returns import n_step_returns

__all__ = ["ReplaySpec", "ReplayBuffer", "init", "add", "sample", "draw", "update_priorities", "set_priorities",
           "size", "num_sampleable", "can_sample"]

REQUIRED_KEYS = ("obs", "action", "reward", "terminated", "done", "valid")
SAMPLE_KEYS = ("discount", "next_obs", "weight", "index")


@dataclass(frozen=True)
class ReplaySpec:
    """Static configuration of a buffer (Python values only).

    rows_per_env: C, rows kept per env (capacity // num_envs); num_envs: B; n_step: n;
    gamma: discount; prioritized / alpha / priority_eps: see `update_priorities`;
    frame_stack: S, frames per observation when frame-deduplicated, else 1.
    """
    rows_per_env: int
    num_envs: int
    n_step: int
    gamma: float
    prioritized: bool
    alpha: float
    priority_eps: float
    frame_stack: int
    device: torch.device

    @property
    def capacity(self) -> int:
        return self.rows_per_env * self.num_envs

    @property
    def frame_dedup(self) -> bool:
        return self.frame_stack > 1


@dataclass(frozen=True)
class ReplayBuffer:
    """A replay buffer: preallocated tensors plus the number of rows written per env.

    storage: TensorDict [C, B], the stored keys of each row (obs holds only the newest
      frame [H, W] when frame-deduplicated); row of absolute time a at position a % C.
    rows: TensorDict [C, B], bookkeeping per row: `priority` float32 (p^alpha given at
      insertion or by `update_priorities`), `sampleable` bool, `stack_start` bool.
    tree: float64 [2 L] sum tree; leaf p * B + b = priority * sampleable of row (p, b).
    max_priority: float32 [], largest p^alpha so far (new rows get it; 1 at first).
    sampleable_count: int64 [], number of sampleable rows.
    steps_written: W, rows written per env since `init` (a Python int).
    The tensors are mutated in place by `add` / `update_priorities`; use the returned
    buffer afterwards (the one passed in is stale).
    """
    spec: ReplaySpec
    storage: TensorDictBase
    rows: TensorDict
    tree: torch.Tensor
    max_priority: torch.Tensor
    sampleable_count: torch.Tensor
    steps_written: int = 0


def _check_example(example: TensorDictBase) -> TensorDictBase:
    """The per-row TensorDict [] of an example rollout [T, B] or row spec []."""
    if not isinstance(example, TensorDictBase) or example.batch_dims not in (0, 2):
        raise ValueError("example must be a TensorDict rollout with batch_size [T, B] or one row with "
                         f"batch_size [], got {type(example).__name__} "
                         f"{getattr(example, 'batch_size', '')}")
    missing = [k for k in REQUIRED_KEYS if k not in example.keys()]
    if missing:
        raise ValueError(f"example lacks the keys {missing}; a rollout needs {list(REQUIRED_KEYS)}")
    reserved = [k for k in SAMPLE_KEYS if k in example.keys() and k != "next_obs"]
    if reserved:
        raise ValueError(f"example keys {reserved} clash with the keys a sample adds {list(SAMPLE_KEYS)}")
    row = example if example.batch_dims == 0 else example[0, 0]
    check_float(reward=row["reward"])
    check_bool(terminated=row["terminated"], done=row["done"], valid=row["valid"])
    for key in ("reward", "terminated", "done", "valid"):
        check_shape(key, row[key], (), "[] per row (rollout [T, B])")
    return row.exclude("next_obs")


def init(example: TensorDictBase, capacity: int, *, num_envs: int | None = None, n_step: int = 1,
         gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6, priority_eps: float = 1e-6,
         frame_dedup: bool = False, device: str | torch.device = "cpu",
         memmap_dir: str | Path | None = None) -> ReplayBuffer:
    """An empty buffer holding `capacity` rows (capacity // num_envs per env) shaped like `example`.

    example: a rollout TensorDict [T, B] (B gives num_envs, T is checked against the
    capacity) or one row []; every key but `next_obs` is stored. frame_dedup: store only
    obs[..., -1, :, :] of uint8 [S, H, W] stacks and rebuild them at sample time.
    memmap_dir: keep the storage in memory-mapped files there (CPU only).
    """
    row = _check_example(example)
    if num_envs is None:
        if example.batch_dims != 2:
            raise ValueError("num_envs is required when example is a single row")
        num_envs = example.batch_size[1]
    if example.batch_dims == 2 and example.batch_size[1] != num_envs:
        raise ValueError(f"example has B={example.batch_size[1]} envs but num_envs={num_envs}")
    if num_envs < 1 or capacity < num_envs:
        raise ValueError(f"capacity={capacity} must hold at least one row per env (num_envs={num_envs})")
    rows_per_env = capacity // num_envs
    if example.batch_dims == 2 and rows_per_env < example.batch_size[0]:
        raise ValueError(f"capacity={capacity} holds {rows_per_env} rows per env, fewer than one rollout "
                         f"of T={example.batch_size[0]}; use capacity >= {example.batch_size[0] * num_envs}")
    frame_stack = 1
    if frame_dedup:
        obs = row["obs"]
        if not torch.is_tensor(obs) or obs.dtype != torch.uint8 or obs.ndim != 3:
            raise ValueError("frame_dedup needs obs to be uint8 frame stacks [S, H, W], got "
                             f"{getattr(obs, 'dtype', type(obs).__name__)} {tuple(getattr(obs, 'shape', ()))}")
        frame_stack = obs.shape[0]
        row.set("obs", obs[-1])
    if not 1 <= n_step <= rows_per_env - frame_stack:
        raise ValueError(f"n_step={n_step} does not fit {rows_per_env} rows per env"
                         f"{' with frame stacks of ' + str(frame_stack) if frame_dedup else ''}: "
                         f"need 1 <= n_step <= {rows_per_env - frame_stack}")
    if not 0.0 <= gamma <= 1.0 or alpha < 0.0 or priority_eps < 0.0:
        raise ValueError(f"need 0 <= gamma <= 1, alpha >= 0, priority_eps >= 0; got gamma={gamma}, "
                         f"alpha={alpha}, priority_eps={priority_eps}")
    device = torch.device(device)
    if memmap_dir is not None and device.type != "cpu":
        raise ValueError(f"memmap_dir needs device='cpu', got device={device}")

    C, B = rows_per_env, num_envs
    if memmap_dir is None:
        storage = row.apply(lambda x: torch.zeros((C, B, *x.shape), dtype=x.dtype, device=device),
                            batch_size=[C, B], device=device)
    else:
        storage = row.to("cpu").expand(C, B).memmap_like(prefix=str(memmap_dir))
    rows = TensorDict({"priority": torch.ones(C, B, device=device),
                       "sampleable": torch.zeros(C, B, dtype=torch.bool, device=device),
                       "stack_start": torch.zeros(C, B, dtype=torch.bool, device=device)},
                      batch_size=[C, B], device=device)
    spec = ReplaySpec(rows_per_env=C, num_envs=B, n_step=n_step, gamma=float(gamma),
                      prioritized=prioritized, alpha=float(alpha), priority_eps=float(priority_eps),
                      frame_stack=frame_stack, device=device)
    return ReplayBuffer(spec=spec, storage=storage, rows=rows, tree=sum_tree_init(C * B, device),
                        max_priority=torch.ones((), device=device),
                        sampleable_count=torch.zeros((), dtype=torch.int64, device=device))


_LAST_CHECKED: tuple = ()   # (weakref to storage, weakref to rollout, its batch size, its keys): passed


def _check_rollout(buffer: ReplayBuffer, rollout: TensorDictBase) -> None:
    """Raise unless `rollout` is [T, B] with T <= C and exactly the stored keys, shapes, dtypes.

    A sampler hands the same (reused) rollout TensorDict to every `add`; once it has passed,
    the same rollout with the same batch size and keys into the same storage is not checked
    again (the check costs ~0.25 ms, a quarter of a one-env DQN step's budget)."""
    global _LAST_CHECKED
    if _LAST_CHECKED and _LAST_CHECKED[0]() is buffer.storage and _LAST_CHECKED[1]() is rollout \
            and _LAST_CHECKED[2] == rollout.batch_size and _LAST_CHECKED[3] == tuple(rollout.keys()):
        return
    _check_rollout_now(buffer, rollout)
    _LAST_CHECKED = (weakref.ref(buffer.storage), weakref.ref(rollout), rollout.batch_size, tuple(rollout.keys()))


def _check_rollout_now(buffer: ReplayBuffer, rollout: TensorDictBase) -> None:
    spec = buffer.spec
    if not isinstance(rollout, TensorDictBase) or rollout.batch_dims != 2:
        raise ValueError(f"rollout must be a TensorDict with batch_size [T, B], got "
                         f"{type(rollout).__name__} {getattr(rollout, 'batch_size', '')}")
    T, B = rollout.batch_size
    if B != spec.num_envs:
        raise ValueError(f"rollout has B={B} envs but the buffer was made for num_envs={spec.num_envs}")
    if T > spec.rows_per_env:
        raise ValueError(f"rollout has T={T} steps but the buffer holds {spec.rows_per_env} rows per env; "
                         f"use capacity >= {T * B}")
    stored = set(buffer.storage.keys(include_nested=True, leaves_only=True))
    given = {k for k in rollout.keys(include_nested=True, leaves_only=True)
             if (k if isinstance(k, str) else k[0]) != "next_obs"}
    if stored != given:
        raise ValueError(f"rollout keys differ from the buffer's: missing {sorted(map(str, stored - given))}, "
                         f"unexpected {sorted(map(str, given - stored))}")
    for key in stored:
        want, got = buffer.storage.get(key), rollout.get(key)
        row_shape = tuple(want.shape[2:])
        if key == "obs" and spec.frame_dedup:
            row_shape = (spec.frame_stack, *row_shape)
        if tuple(got.shape[2:]) != row_shape or got.dtype != want.dtype:
            raise ValueError(f"rollout[{key!r}] is {got.dtype} {tuple(got.shape)}; the buffer stores "
                             f"{want.dtype} [T, B, {', '.join(map(str, row_shape))}]")


def _write_ring(dest, data, start: int) -> None:
    """dest[(start + t) % C] = data[t] for t < T (T <= C), as at most two slice writes.

    dest: tensor or TensorDict [C, ...]; data: the same kind, [T, ...]."""
    C, T = dest.shape[0], data.shape[0]
    first = min(T, C - start)
    dest[start:start + first] = data[:first]
    if first < T:
        dest[:T - first] = data[first:]


def _oldest(spec: ReplaySpec, steps_written):
    """Absolute time of the oldest row still stored (an int, or a 0-d tensor for a tensor W)."""
    if torch.is_tensor(steps_written):
        return (steps_written - spec.rows_per_env).clamp(min=0)
    return max(0, steps_written - spec.rows_per_env)


def _absolute_row(spec: ReplaySpec, position: torch.Tensor, steps_written: int) -> torch.Tensor:
    """Absolute time of the row stored at ring position `position` (the latest a < W with a % C = p)."""
    C = spec.rows_per_env
    return position + C * torch.div(steps_written - 1 - position, C, rounding_mode="floor")


def _sampleable(spec: ReplaySpec, storage, rows, row: torch.Tensor, steps_written) -> torch.Tensor:
    """Whether rows of absolute times `row` [K] (all still stored) may be sampled, per env: bool [K, B].

    valid, and row <= W - 1 - n (its window and bootstrap row are written), and
    row >= W - C (stored), and with frame_dedup its whole frame stack is still stored.
    """
    oldest = _oldest(spec, steps_written)
    in_window = (row >= oldest) & (row <= steps_written - 1 - spec.n_step)
    ok = storage["valid"][row % spec.rows_per_env] & in_window.unsqueeze(1)
    if spec.frame_dedup:
        env = torch.arange(spec.num_envs, device=row.device)
        sources = stack_source_rows(row.unsqueeze(1), env, rows["stack_start"], oldest, spec.frame_stack)
        ok = ok & (sources[..., 0] >= oldest)
    return ok


def _refresh(spec: ReplaySpec, storage, rows, tree, sampleable_count, row: torch.Tensor, steps_written,
             dedup: bool = True) -> None:
    """Recompute `sampleable`, its count and the tree leaves of the distinct absolute rows `row` [K]."""
    position = row % spec.rows_per_env
    new = _sampleable(spec, storage, rows, row, steps_written)
    old = rows["sampleable"][position]
    sampleable_count.add_(new.sum() - old.sum())
    rows["sampleable"][position] = new
    leaf = (position.unsqueeze(1) * spec.num_envs + torch.arange(spec.num_envs, device=row.device)).flatten()
    sum_tree_set(tree, leaf, (rows["priority"][position] * new).flatten(), dedup=dedup)


def add(buffer: ReplayBuffer, rollout: TensorDictBase, *, compiled: bool = False,
        ahead_of_time: bool = False) -> ReplayBuffer:
    """Write a rollout [T, B] at the write cursor (wrapping around) and return the buffer.

    Every key but `next_obs` is stored (next_obs[t] == obs[t + 1] per env, so the bootstrap
    observation of row t is the stored obs of row t + m). New rows get priority
    `max_priority`; rows become sampleable once the rule in the package docstring holds.

    compiled: write and refresh the T + n rows that change with one `torch.compile`d graph
    (in place, W passed as a tensor so it compiles once per buffer shape and T) instead of
    ~25 eager tensor ops, once W >= n and C >= T + n (before that, and for frame-deduplicated
    buffers, eagerly). Same buffer contents as eager. ahead_of_time (with compiled): that graph
    as an AOTInductor model (`fnrl.accel.aot.AotFunction`, one per buffer and rollout structure),
    which skips TorchDynamo's ~0.1 ms around each call; `torch.compile` where it cannot be built.
    """
    _check_rollout(buffer, rollout)
    spec, W = buffer.spec, buffer.steps_written
    C, (T, B) = spec.rows_per_env, rollout.batch_size
    data = rollout.exclude("next_obs")
    if data.device != spec.device:   # a sampler's rollout states its device; a TensorDict without one is moved
        data = data.to(spec.device)
    if compiled and _writes_compiled(buffer, T):
        args = _write_args(buffer, data)
        write = _aot_write(spec, args) if ahead_of_time and aot.serves(spec.device) else None
        if write is not None:
            write(*args)
        else:
            _compiled_write()(spec, *args)
        return dataclasses.replace(buffer, steps_written=W + T)
    start = W % C
    if spec.frame_dedup:
        obs = data["obs"]
        previous_valid = (buffer.storage["valid"][(W - 1) % C] if W > 0
                          else torch.zeros(B, dtype=torch.bool, device=spec.device))
        follows_reset = ~torch.cat([previous_valid.unsqueeze(0), data["valid"][:-1]])
        starts = stack_starts(obs, follows_reset)
        data.set("obs", obs[:, :, -1])
        _write_ring(buffer.rows["stack_start"], starts, start)
    _write_ring(buffer.storage, data, start)
    new_position = torch.arange(W, W + T, device=spec.device) % C
    buffer.rows["priority"][new_position] = buffer.max_priority

    steps = W + T
    oldest = _oldest(spec, steps)
    changed = torch.arange(max(W - spec.n_step, oldest), steps, device=spec.device)   # newly complete + new rows
    if spec.frame_dedup:
        changed = torch.cat([changed, torch.arange(oldest, min(oldest + spec.frame_stack - 1, steps),
                                                   device=spec.device)]).unique()        # lost history
    _refresh(spec, buffer.storage, buffer.rows, buffer.tree, buffer.sampleable_count, changed, steps)
    return dataclasses.replace(buffer, steps_written=steps)


def _write(spec: ReplaySpec, storage, rows, tree, max_priority, sampleable_count, data, steps_written) -> None:
    """`add`'s tensor work once W >= n and C >= T + n (no frame dedup), in place: the rows
    W .. W+T-1 at positions (W + t) % C get `data` [T, B] and priority `max_priority`; the
    rows that change status are then exactly W - n .. W + T - 1 (all stored, all distinct).
    steps_written: W as a 0-d int64 tensor."""
    T, n = data.batch_size[0], spec.n_step
    offsets = torch.arange(T + n, device=steps_written.device)
    position = (steps_written + offsets[:T]) % spec.rows_per_env
    for key, value in data.items(include_nested=True, leaves_only=True):
        storage.get(key)[position] = value
    rows.get("priority")[position] = max_priority
    _refresh(spec, storage, rows, tree, sampleable_count, steps_written - n + offsets, steps_written + T,
             dedup=False)


_COMPILED_WRITE = None


def prepare_write(buffer: ReplayBuffer, rollout: TensorDictBase) -> bool:
    """Build the ahead-of-time model that `add(buffer, rollout, compiled=True, ahead_of_time=True)`
    writes with (inside `fnrl.accel.aot.provided`: load it), without writing anything: the buffer
    is left as it is. False where such an add writes without a model (see `add`), or the model
    cannot be built. A tiered run (`fnrl.accel.tiered`) loads it before its first compiled add."""
    _check_rollout(buffer, rollout)
    if not (_writes_compiled(buffer, rollout.batch_size[0]) and aot.serves(buffer.spec.device)):
        return False
    data = rollout.exclude("next_obs").to(buffer.spec.device)
    return _aot_write(buffer.spec, _write_args(buffer, data)) is not None


def _writes_compiled(buffer: ReplayBuffer, T: int) -> bool:
    """Whether a compiled add of T steps writes with one graph (`add`'s rule)."""
    spec = buffer.spec
    return not spec.frame_dedup and buffer.steps_written >= spec.n_step and spec.rows_per_env >= T + spec.n_step


def _write_args(buffer: ReplayBuffer, data: TensorDictBase) -> tuple:
    """The tensors `_write` takes for writing `data` (the rollout without next_obs) into `buffer`."""
    return (buffer.storage, buffer.rows, buffer.tree, buffer.max_priority, buffer.sampleable_count, data,
            torch.scalar_tensor(buffer.steps_written, dtype=torch.int64, device=buffer.spec.device))


def _compiled_write():
    """`_write` under torch.compile (made on first use, shared by all buffers)."""
    global _COMPILED_WRITE
    if _COMPILED_WRITE is None:
        _COMPILED_WRITE = torch.compile(_write, fullgraph=True, dynamic=False)
    return _COMPILED_WRITE


_AOT_WRITES: dict = {}   # id(storage) -> (weakref to storage, {rollout structure: model or None})


def _aot_write(spec: ReplaySpec, args: tuple):
    """`_write` for `args` as an AOTInductor model, one per storage and rollout structure (built on
    first use and kept with the storage; None, after one warning, where it cannot be built).
    The storage's structure is fixed when the buffer is made and every rollout's keys and shapes
    are checked against it (`_check_rollout`), so the rollout's batch size tells models apart."""
    storage, data = args[0], args[5]
    ref, models = _AOT_WRITES.get(id(storage), (None, None))
    if ref is None or ref() is not storage:
        for dead in [k for k, (r, _) in _AOT_WRITES.items() if r() is None]:
            del _AOT_WRITES[dead]
        models = {}
        _AOT_WRITES[id(storage)] = (weakref.ref(storage), models)
    key = tuple(data.batch_size)
    if key not in models:
        models[key] = aot.function_or_none("replay writes are", functools.partial(_write, spec), args)
    return models[key]


def clone(buffer: ReplayBuffer) -> ReplayBuffer:
    """The buffer with copies of its tensors: adds and priority updates to one leave the other as it is."""
    return dataclasses.replace(buffer, storage=buffer.storage.clone(), rows=buffer.rows.clone(),
                               tree=buffer.tree.clone(), max_priority=buffer.max_priority.clone(),
                               sampleable_count=buffer.sampleable_count.clone())


def size(buffer: ReplayBuffer) -> int:
    """Number of rows stored (all envs), sampleable or not."""
    return min(buffer.steps_written, buffer.spec.rows_per_env) * buffer.spec.num_envs


def num_sampleable(buffer: ReplayBuffer) -> int:
    """Number of rows that `sample` may return (reads one device scalar)."""
    return int(buffer.sampleable_count)


def can_sample(buffer: ReplayBuffer, batch_size: int) -> bool:
    """Whether at least `batch_size` rows are sampleable."""
    return num_sampleable(buffer) >= batch_size


def _stacked_frames(buffer: ReplayBuffer, row: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
    """Rebuilt uint8 stacks [N, S, H, W] of absolute rows `row` [N] of envs `env` [N]."""
    spec = buffer.spec
    sources = stack_source_rows(row, env, buffer.rows["stack_start"], _oldest(spec, buffer.steps_written),
                                spec.frame_stack)
    flat = (sources % spec.rows_per_env) * spec.num_envs + env.unsqueeze(1)          # [N, S]
    frames = buffer.storage["obs"].flatten(0, 1)                                     # [C B, H, W]
    return frames.index_select(0, flat.flatten()).view(*flat.shape, *frames.shape[1:])


def sample(buffer: ReplayBuffer, batch_size: int, beta: float | torch.Tensor = 0.4, *,
           generator: torch.Generator | None = None, compiled: bool = False) -> TensorDict:
    """Draw `batch_size` sampleable rows (with replacement) and build their n-step targets.

    Uniform buffers draw rows independently and uniformly; prioritized ones draw one row
    per stratum with P(i) = p_i / sum_k p_k and weight it by
        w_i = (N_valid P(i))^-beta / max_j w_j = (min_j p_j / p_i)^beta,
    the max (and min) taken over the batch, as in rlpyt (N_valid cancels).
    For a row t of env b with m = n-step window length (see fnrl.returns.n_step_returns):
        reward   = sum_{k<m} gamma^k r_{t+k},
        discount = gamma^m, or 0 if the episode terminated inside the window,
        next_obs = obs[t + m] (the final observation after a done),
    Returns a TensorDict [N]: obs, action, reward (n-step return), discount, next_obs,
    weight (ones for uniform), index (int64, for `update_priorities`), and every other
    stored key of row t.

    compiled: draw and gather with one `torch.compile`d graph (Inductor's fallback_random,
    so it draws the same random numbers as eager and returns the same batch) instead of
    ~40 eager tensor ops: several times faster for small batches on the CPU. It compiles
    once per buffer shape and batch size; without `generator`. Frame-deduplicated stacks
    are still rebuilt eagerly.
    """
    spec = buffer.spec
    if batch_size > spec.capacity:
        raise ValueError(f"batch_size={batch_size} exceeds the buffer capacity {spec.capacity}")
    available = num_sampleable(buffer)
    if available < batch_size:
        raise ValueError(f"only {available} sampleable rows for batch_size={batch_size}; add more rollouts "
                         f"first (check with can_sample)")
    beta = torch.as_tensor(beta, dtype=buffer.tree.dtype, device=buffer.tree.device)
    draw_fn = _compiled_draw() if compiled and generator is None else draw
    batch, offset = draw_fn(spec, buffer.tree, buffer.storage, batch_size, beta, generator)
    if spec.frame_dedup:
        index = batch["index"]
        position, env = torch.div(index, spec.num_envs, rounding_mode="floor"), index % spec.num_envs
        row = _absolute_row(spec, position, buffer.steps_written)
        batch.set("obs", _stacked_frames(buffer, row, env))
        batch.set("next_obs", _stacked_frames(buffer, row + offset, env))
    return batch


def draw(spec: ReplaySpec, tree: torch.Tensor, storage: TensorDictBase, batch_size: int, beta: torch.Tensor,
         generator: torch.Generator | None = None) -> tuple[TensorDict, torch.Tensor]:
    """The tensor part of `sample`: draw leaves, gather rows and n-step targets.

    Takes a buffer's parts (`buffer.spec`, `buffer.tree`, `buffer.storage`) and beta as a
    0-d float64 tensor. Returns the batch [N] (without obs / next_obs when
    frame-deduplicated) and the bootstrap offsets m [N]. Pure tensor code with static
    shapes and no check, so it compiles inside a larger graph (`fnrl.learner`); the caller
    makes sure that at least one row is sampleable."""
    C, B, n = spec.rows_per_env, spec.num_envs, spec.n_step
    index = sum_tree_sample(tree, batch_size, stratified=spec.prioritized, generator=generator)
    position, env = torch.div(index, B, rounding_mode="floor"), index % B

    window = (position + torch.arange(n, device=index.device).unsqueeze(1)) % C      # [n, N]
    reward = storage["reward"][window, env]
    discount = spec.gamma * (~storage["terminated"][window, env]).to(reward.dtype)
    returns, bootstrap_discount, offset = n_step_returns(reward, discount, storage["done"][window, env], n)

    batch = storage.exclude("obs")[position, env]
    if not spec.frame_dedup:
        obs = storage.get("obs")
        batch.set("obs", obs[position, env])
        batch.set("next_obs", obs[(position + offset[0]) % C, env])
    batch.set("reward", returns[0])
    batch.set("discount", bootstrap_discount[0])
    if spec.prioritized:
        priority = sum_tree_get(tree, index)
        weight = (priority.min() / priority) ** beta
    else:
        weight = torch.ones(batch_size, device=index.device)
    batch.set("weight", weight.to(reward.dtype))
    batch.set("index", index)
    return batch, offset[0]


_COMPILED_DRAW = None


def _compiled_draw():
    """`draw` under torch.compile (made on first use, shared by all buffers)."""
    global _COMPILED_DRAW
    if _COMPILED_DRAW is None:
        _COMPILED_DRAW = torch.compile(draw, fullgraph=True, dynamic=False, options={"fallback_random": True})
    return _COMPILED_DRAW


def update_priorities(buffer: ReplayBuffer, index: torch.Tensor, priority: torch.Tensor) -> ReplayBuffer:
    """Set the priorities of sampled rows from their TD errors; returns the buffer.

    index: int64 [N] from `sample`; priority: [N] TD errors delta (any sign). Stores
    p = (|delta| + priority_eps)^alpha and raises `max_priority` to max(p). A row that
    has stopped being sampleable since it was drawn keeps leaf 0 (its stored priority is
    updated all the same, as in rlpyt). Duplicate indices: one of their values wins.
    """
    set_priorities(buffer.spec, buffer.tree, buffer.rows, buffer.max_priority, index, priority)
    return buffer


def set_priorities(spec, tree: torch.Tensor, table: TensorDict, max_priority: torch.Tensor, index: torch.Tensor,
                   priority: torch.Tensor, dedup: bool = True) -> None:
    """Store p = (|priority| + priority_eps)^alpha for flat items `index` [N] (item = position * B + env)
    in `table["priority"]` [P, B] and the sum tree (masked by `table["sampleable"]`), and raise
    `max_priority`, in place. Shared by the row buffer and the sequence buffer. dedup=False:
    the tree's static-shape update (`sum_tree_set(..., dedup=False)`), for a compiled graph."""
    if not spec.prioritized:
        raise ValueError("update_priorities needs a buffer made with prioritized=True")
    if index.dtype != torch.int64 or index.shape != priority.shape or index.ndim != 1:
        raise ValueError(f"index must be int64 [N] and priority [N]; got index {index.dtype} "
                         f"{tuple(index.shape)}, priority {tuple(priority.shape)}")
    index = index.to(spec.device)
    p = (priority.detach().to(spec.device, torch.float32).abs() + spec.priority_eps) ** spec.alpha
    position, env = torch.div(index, spec.num_envs, rounding_mode="floor"), index % spec.num_envs
    table["priority"][position, env] = p
    sum_tree_set(tree, index, p * table["sampleable"][position, env], dedup=dedup)
    max_priority.copy_(torch.maximum(max_priority, p.max()))
