"""Synchronous data-parallel training: one process per device, gradients averaged.

Every rank runs the same algorithm on its own EnvPool (env seeds `seed + rank * num_envs
+ i`, so the ranks together step the envs of one pool of `world_size * num_envs`) from
identical parameters (same init seed, then broadcast from rank 0). In every
`fnrl.algos.common.gradient_step` the gradient TensorDict is averaged over the ranks
before the optimizer sees it:

    g = (1 / W) * sum_r g_r,

as ONE flat buffer per dtype (all leaves concatenated, one all-reduce SUM, divided by
W, split back), so the optimizer chain (gradient clipping, Adam, ...) runs on the
same averaged gradient on every rank and the parameters stay identical. When each
rank's loss is a mean over the same number of valid samples, `g` is exactly the
gradient of the loss on the concatenated batch. Statistics computed inside a loss
stay per rank: PPO's advantage normalization (`norm_adv`) uses each rank's own
minibatch mean/std (as CleanRL's multi-GPU PPO does), and running observation / reward
normalizers (`normalize_obs`, `normalize_reward`) are updated from each rank's own data
(the checkpoint holds rank 0's).

The all-reduce uses functional collectives (`torch.distributed._functional_collectives`),
which trace under `torch.compile(fullgraph=True)`, so the compiled update holds the
collective inside its graph (checked on CPU/gloo with torch 2.13). Backends: gloo on
CPU, NCCL on CUDA.
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from tensordict import TensorDict

from fnrl.algos import common
from fnrl.errors import ConfigError

STORE_VAR = "FNRL_DIST_STORE"
"""A FileStore path: where set (by `fnrl train --nproc`, `fnrl.distributed.launch`), a rank joins
the process group through it (with RANK and WORLD_SIZE) instead of torchrun's TCP rendezvous."""

TIMEOUT_ENV = "FNRL_DIST_TIMEOUT"
"""Seconds a collective (and the process-group rendezvous) waits for the other ranks
before failing (default 600): a rank that dies without its launcher noticing cannot
hang the others for longer."""


def all_reduce_mean(grads: TensorDict, group=None) -> TensorDict:
    """The mean over ranks of a TensorDict of tensors, through one flat buffer per dtype.

    grads: TensorDict (nested allowed) with the same keys, shapes and dtypes on every
    rank. Returns a new TensorDict of the same structure holding
    `sum_r grads_r / world_size`. Pure and traceable by `torch.compile(fullgraph=True)`.
    """
    group = group if group is not None else dist.group.WORLD
    size = dist.get_world_size(group)
    keys = list(grads.keys(include_nested=True, leaves_only=True))
    values = [grads.get(k) for k in keys]
    out = grads.empty(recurse=True)
    for dtype in dict.fromkeys(v.dtype for v in values):
        idx = [i for i, v in enumerate(values) if v.dtype == dtype]
        flat = torch.cat([values[i].reshape(-1) for i in idx])
        flat = funcol.all_reduce(flat, "sum", group) / size
        for i, chunk in zip(idx, flat.split([values[i].numel() for i in idx])):
            out.set(keys[i], chunk.view_as(values[i]))
    return out


class World:
    """One process: rank 0 of 1, every collective the identity. The base of `ProcessGroupWorld`,
    so the training loop is written once for both."""

    rank, size, local_rank = 0, 1, 0

    @property
    def main(self) -> bool:
        """True on the rank that logs, draws the progress bar and writes checkpoints."""
        return self.rank == 0

    def device(self, device: str) -> str:
        return device

    @contextmanager
    def agree(self):
        """Run a block (setup) on every rank; see ProcessGroupWorld.agree."""
        yield

    def broadcast_object(self, obj):
        """Rank 0's `obj` (picklable) on every rank."""
        return obj

    def broadcast_state(self, state: TensorDict) -> TensorDict:
        """Rank 0's state on every rank (in place)."""
        return state

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of a list of floats over the ranks."""
        return list(values)

    def max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of a list of floats over the ranks."""
        return list(values)

    def gather(self, values: list[float]) -> list[float]:
        """Every rank's list of floats (of any length), joined in rank order, on every rank."""
        return list(values)

    def mean(self, scalars: dict) -> dict:
        """The mean over ranks of a dict of floats with the same keys on every rank (a NaN on
        any rank makes that entry NaN on all)."""
        keys = sorted(scalars)
        if self.size == 1 or not keys:
            return dict(scalars)
        return {k: v / self.size for k, v in zip(keys, self.sum([scalars[k] for k in keys]))}

    def close(self) -> None:
        pass


class ProcessGroupWorld(World):
    """The ranks of an initialized default process group (joined from torchrun's environment
    variables if none is initialized yet). Holds `all_reduce_mean` open as the gradient reducer
    of `gradient_step` (`fnrl.algos.common.reducing_gradients`) until `close()`."""

    def __init__(self, device: str = "cpu"):
        self._reducing = None
        self._owns_group = not dist.is_initialized()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self._owns_group:
            cuda = device.startswith("cuda")
            if cuda:
                torch.cuda.set_device(self.local_rank)
            timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "600")))
            store = os.environ.get(STORE_VAR)   # a --nproc run's private rendezvous (fnrl.distributed.launch)
            init = dict(init_method=f"file://{store}", rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"])) if store else {}
            dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout, **init)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._cuda = dist.get_backend() == "nccl"
        self._reducing = common.reducing_gradients(all_reduce_mean)
        self._reducing.__enter__()

    def device(self, device: str) -> str:
        return f"cuda:{self.local_rank}" if device == "cuda" else device

    @property
    def _tensor_device(self):
        return torch.device("cuda", torch.cuda.current_device()) if self._cuda else torch.device("cpu")

    @contextmanager
    def agree(self):
        """Run a block on every rank; if it raised on any rank, raise on every rank.

        The failing rank re-raises its own exception; the others raise a ConfigError with
        the same one-line message (or naming the rank, for other exceptions), so a bad
        option or an existing run folder stops all ranks before any work, with no rank
        left waiting in a collective.
        """
        error = None
        try:
            yield
        except Exception as e:
            error = e
        report = None if error is None else (self.rank, isinstance(error, ConfigError), str(error))
        reports = [None] * self.size
        dist.all_gather_object(reports, report)
        if error is not None:
            raise error
        failed = next((r for r in reports if r is not None), None)
        if failed is not None:
            rank, config_error, message = failed
            raise ConfigError(message if config_error else f"rank {rank} failed during setup: {message}")

    def broadcast_object(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_state(self, state: TensorDict) -> TensorDict:
        differs = False
        for key in state.keys(include_nested=True, leaves_only=True):
            x = state.get(key)
            mine = x.clone()
            dist.broadcast(x, src=0)
            differs |= not torch.equal(mine, x)
        if differs:
            warnings.warn(f"rank {self.rank}: the initial state differed from rank 0's; using rank 0's")
        return state

    def sum(self, values: list[float]) -> list[float]:
        x = torch.tensor(values, dtype=torch.float64, device=self._tensor_device)
        dist.all_reduce(x)
        return x.tolist()

    def max(self, values: list[float]) -> list[float]:
        x = torch.tensor(values, dtype=torch.float64, device=self._tensor_device)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.tolist()

    def gather(self, values: list[float]) -> list[float]:
        # tensors only: the lengths first, then a [size, longest] table with each rank's own row filled
        lengths = [0.0] * self.size
        lengths[self.rank] = float(len(values))
        lengths = [int(n) for n in self.sum(lengths)]
        table = torch.zeros(self.size, max(lengths), dtype=torch.float64, device=self._tensor_device)
        table[self.rank, :len(values)] = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(table)
        return [v for r, n in enumerate(lengths) for v in table[r, :n].tolist()]

    def close(self) -> None:
        if self._reducing is not None:
            reducing, self._reducing = self._reducing, None
            reducing.__exit__(None, None, None)
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()


class RowsOnly:
    """The logger of ranks other than 0: keeps the rows (for the returned history), writes nothing."""

    def __init__(self):
        self.rows: list[dict] = []

    def log(self, row: dict) -> None:
        self.rows.append(row)

    def plot(self, title: str = "") -> None:
        pass

    def close(self) -> None:
        pass


def world_from_env(device: str = "cpu") -> World:
    """The World this process belongs to: a `ProcessGroupWorld` when a process group is
    initialized or torchrun launched it with WORLD_SIZE > 1, else the one-process `World`."""
    if dist.is_available() and (dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        return ProcessGroupWorld(device)
    return World()
