"""Fast access to TensorDicts on the eager paths: a leaf read through the TensorDicts' own dicts,
and construction without tensordict's per-value checks, each with tensordict's API as the
fallback. Traced code sees the same tensors either way."""
from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDict, TensorDictBase


def leaf_reader(key) -> Callable[[TensorDictBase], torch.Tensor]:
    """`td -> td.get(key)` through the TensorDicts' own dicts, without `get`'s key parsing; `get`
    where a level is not a plain TensorDict."""
    path = (key,) if isinstance(key, str) else tuple(key)

    def leaf(td):
        try:
            out = td
            for k in path:
                out = out._tensordict[k]
            return out
        except (AttributeError, KeyError):
            return td.get(key)

    return leaf


_new_unsafe = getattr(TensorDict, "_new_unsafe", None)


def unchecked_tensordict(items: dict, batch_size, device=None) -> TensorDict:
    """`TensorDict(items, batch_size, device)` built without tensordict's checks of every value
    where it offers that (`TensorDict._new_unsafe`): for items known to fit the batch size."""
    if _new_unsafe is None:
        return TensorDict(items, batch_size=batch_size, device=device)
    return _new_unsafe(items, batch_size=torch.Size(batch_size), device=device)   # a list would fail guards


def entries(td: TensorDictBase):
    """`td.items()`: for a plain TensorDict, its own dict's items (no per-entry checks)."""
    return td._tensordict.items() if type(td) is TensorDict else td.items()


def gather_rows(td: TensorDictBase, index: torch.Tensor) -> TensorDict | None:
    """`td[index]` for a 1-D index over a plain TensorDict of tensors with one batch dimension:
    each entry gathered with `index_select`, the result built unchecked (the same tensors as
    `td[index]`). None for any other TensorDict."""
    if type(td) is not TensorDict or td.batch_dims != 1:
        return None
    rows = {}
    for key, value in td._tensordict.items():
        if not torch.is_tensor(value):
            return None
        rows[key] = value.index_select(0, index)
    return unchecked_tensordict(rows, index.shape, td.device)
