"""Replay buffers in checkpoints: their size, and a saved buffer moved onto the run's device.

A buffer (`ReplayBuffer`, `SequenceBuffer` or the `MultiBuffer` of a vmapped run) is a frozen
dataclass of tensors, TensorDicts and Python values, so `torch.save` writes it as it is;
`fnrl.train` keeps it in the checkpoint while it holds at most `CHECKPOINT_BYTES`, so that an
off-policy run resumes with the experience it had instead of an empty replay.
"""
from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase

CHECKPOINT_BYTES = 1 << 30
"""The largest buffer (in bytes) a checkpoint holds: 1 GiB (a 1M-step HalfCheetah replay is 0.12 GiB; an
Atari one, ~7 GiB even with frame deduplication, starts empty on resume)."""


def _fields(buffer):
    return {f.name: getattr(buffer, f.name) for f in dataclasses.fields(buffer)}


def nbytes(buffer) -> int:
    """Bytes of the buffer's tensors (memory-mapped ones included)."""
    if isinstance(buffer, torch.Tensor):
        return buffer.nbytes
    if isinstance(buffer, TensorDictBase):
        return sum(v.nbytes for v in buffer.values(include_nested=True, leaves_only=True))
    if isinstance(buffer, tuple):
        return sum(nbytes(b) for b in buffer)
    if dataclasses.is_dataclass(buffer) and not isinstance(buffer, type):
        return sum(nbytes(v) for v in _fields(buffer).values())
    return 0


def to_device(buffer, device):
    """The buffer with every tensor on `device` (and a spec naming that device)."""
    device = torch.device(device)
    if isinstance(buffer, (torch.Tensor, TensorDictBase)):
        return buffer.to(device)
    if isinstance(buffer, tuple):
        return tuple(to_device(b, device) for b in buffer)
    if dataclasses.is_dataclass(buffer) and not isinstance(buffer, type):
        fields = _fields(buffer)
        if "device" in fields:   # a spec
            return dataclasses.replace(buffer, device=device)
        return dataclasses.replace(buffer, **{k: to_device(v, device) for k, v in fields.items()})
    return buffer
