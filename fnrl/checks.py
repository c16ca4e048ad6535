"""Argument checks shared by the primitives.

Every check reads only static metadata (shape, dtype, ndim), so under
`torch.compile` it runs once at trace time and costs nothing in the graph, and
under `torch.func.vmap` it sees the per-example shape.  Each failure raises a
`ValueError` that names the argument and what was expected.
"""
from __future__ import annotations

import torch

__all__ = ["check_float", "check_bool", "check_same_shape", "check_min_rank", "check_time", "check_shape"]


def check_float(**tensors: torch.Tensor) -> None:
    """Raise unless every tensor has a floating-point dtype."""
    for name, x in tensors.items():
        if not torch.is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_bool(**tensors: torch.Tensor) -> None:
    """Raise unless every tensor is boolean (episode flags such as `done`, `valid`)."""
    for name, x in tensors.items():
        if not torch.is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.bool:
            raise ValueError(f"{name} must be a bool tensor, got dtype {x.dtype}")


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise unless all tensors have the shape of the first one.

    >>> check_same_shape(reward=r, value=v)  # names appear in the message
    """
    items = list(tensors.items())
    ref_name, ref = items[0]
    for name, x in items[1:]:
        if x.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)} but {ref_name} has shape {tuple(ref.shape)}; "
                f"expected {name} of shape {tuple(ref.shape)}"
            )


def check_min_rank(name: str, x: torch.Tensor, rank: int, layout: str) -> None:
    """Raise unless `x` has at least `rank` dims; `layout` describes them, e.g. "[T, ...]"."""
    if x.ndim < rank:
        raise ValueError(f"{name} must have shape {layout} (at least {rank} dims), got shape {tuple(x.shape)}")


def check_time(**tensors: torch.Tensor) -> None:
    """Raise unless all tensors are at least 1-D and share the leading (time) dimension."""
    items = list(tensors.items())
    for name, x in items:
        check_min_rank(name, x, 1, "[T, ...]")
    ref_name, ref = items[0]
    for name, x in items[1:]:
        if x.shape[0] != ref.shape[0]:
            raise ValueError(
                f"{name} has T={x.shape[0]} (shape {tuple(x.shape)}) but {ref_name} has T={ref.shape[0]}; "
                f"all time-major arguments must share the leading dimension"
            )


def check_shape(name: str, x: torch.Tensor, shape: tuple, layout: str) -> None:
    """Raise unless `x.shape == shape`; `layout` names the dims, e.g. "[T, B]"."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(x.shape)}")
