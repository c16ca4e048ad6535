"""Checkpoint contents as plain data, so that a checkpoint is read without running code from it.

`torch.load(..., weights_only=True)` rebuilds only tensors, numbers, strings, bytes, lists,
tuples, sets, dicts and a few torch types (`torch.device`, `torch.dtype`, `torch.Size`); anything
else in a pickle stream is refused before it is built. `to_plain` writes every other value a
checkpoint holds in those terms, tagged with the reserved key `TAG`:

    TensorDict            {TAG: "tensordict", "batch_size": [...], "data": {key: value}}
    numpy array           {TAG: "ndarray", "dtype": "<u4", "shape": [...], "bytes": b"..."}
    an fnrl dataclass     {TAG: "dataclass", "type": "ReplayBuffer", "fields": {...}}  (`DATACLASSES` only)

and `from_plain` turns them back. A value of any other type is a TypeError when it is written,
so nothing that needs unpickling can enter a checkpoint unnoticed (an in-process env's snapshot
is plain data too: `fnrl.envs.inprocess`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from fnrl.replay.buffer import ReplayBuffer, ReplaySpec
from fnrl.replay.multi import MultiBuffer
from fnrl.replay.sequence import SequenceBuffer, SequenceSpec

TAG = "__fnrl__"
"""The reserved key of a tagged value (a dict of a checkpoint may not use it)."""

DATACLASSES = {cls.__name__: cls for cls in (ReplaySpec, ReplayBuffer, SequenceSpec, SequenceBuffer, MultiBuffer)}
"""The dataclasses a checkpoint may hold (the replay buffers), by name: only these are rebuilt."""

_AS_IS = (type(None), bool, int, float, str, bytes, torch.device, torch.dtype, torch.Size)


def to_plain(value, where: str = "checkpoint"):
    """`value` as plain data (module docstring); TypeError naming `where` the first value is that
    cannot be written so."""
    if isinstance(value, torch.Tensor):
        return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)
    if isinstance(value, _AS_IS):
        return value
    if isinstance(value, TensorDictBase):
        return {TAG: "tensordict", "batch_size": list(value.batch_size),
                "data": {k: to_plain(v, f"{where}[{k!r}]") for k, v in value.items()}}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"{where} is a numpy array of Python objects, which a checkpoint cannot hold")
        return {TAG: "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                "bytes": np.ascontiguousarray(value).tobytes()}
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if DATACLASSES.get(name) is not type(value):
            raise TypeError(f"{where} is a {type(value).__qualname__}, which a checkpoint cannot hold "
                            f"(only {', '.join(DATACLASSES)})")
        return {TAG: "dataclass", "type": name,
                "fields": {f.name: to_plain(getattr(value, f.name), f"{where}.{f.name}")
                           for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        if TAG in value:
            raise TypeError(f"{where} uses the reserved key {TAG!r}")
        return {k: to_plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if type(value) in (list, tuple, set):
        return type(value)(to_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise TypeError(f"{where} is a {type(value).__qualname__}, which a checkpoint cannot hold")


def from_plain(value):
    """The values `to_plain` wrote, rebuilt (tensors, TensorDicts, numpy arrays, `DATACLASSES`);
    ValueError for a tag or dataclass it does not know."""
    if isinstance(value, dict):
        tag = value.get(TAG)
        if tag is None:
            return {k: from_plain(v) for k, v in value.items()}
        if tag == "tensordict":
            return TensorDict({k: from_plain(v) for k, v in value["data"].items()}, batch_size=value["batch_size"])
        if tag == "ndarray":
            return np.frombuffer(value["bytes"], dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        if tag == "dataclass":
            cls = DATACLASSES.get(value["type"])
            if cls is None:
                raise ValueError(f"a checkpoint names a dataclass {value['type']!r} that fnrl does not rebuild")
            return cls(**{k: from_plain(v) for k, v in value["fields"].items()})
        raise ValueError(f"a checkpoint holds a value tagged {tag!r}, which fnrl does not know")
    if type(value) in (list, tuple, set):
        return type(value)(from_plain(v) for v in value)
    return value

