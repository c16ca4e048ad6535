"""Running mean / variance statistics as pure functions over a small TensorDict.

Used for BatchPPO's observation and reward normalization. The statistics live in the
train state, so they are checkpointed, vmapped over seeds and compiled like the rest.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict


def rms_init(shape, dtype=torch.float32) -> TensorDict:
    """Statistics of nothing yet: mean 0, var 1, count ~0 ([*shape] each, count [])."""
    return TensorDict(
        {"mean": torch.zeros(shape, dtype=dtype), "var": torch.ones(shape, dtype=dtype),
         "count": torch.tensor(1e-4, dtype=dtype)},
        batch_size=[],
    )


def rms_update(rms: TensorDict, x: torch.Tensor, mask: torch.Tensor | None = None) -> TensorDict:
    """Merge the batch `x` [N, *shape] (rows where `mask` [N] is True) into `rms`.

    Chan et al. (1979) parallel update:
    delta = m_b - m, n' = n + n_b, m' = m + delta n_b / n',
    v' = (v n + v_b n_b + delta^2 n n_b / n') / n'.
    """
    x = x.to(rms["mean"].dtype)
    w = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if mask is None else mask.to(x.dtype)
    w = w.reshape(-1, *([1] * (x.ndim - 1)))
    n_b = w.sum().clamp(min=1.0)
    mean_b = (x * w).sum(0) / n_b
    var_b = (((x - mean_b) ** 2) * w).sum(0) / n_b
    n = rms["count"]
    total = n + n_b
    delta = mean_b - rms["mean"]
    mean = rms["mean"] + delta * n_b / total
    var = (rms["var"] * n + var_b * n_b + delta**2 * n * n_b / total) / total
    return TensorDict({"mean": mean, "var": var, "count": total}, batch_size=[])


def rms_normalize(rms: TensorDict, x: torch.Tensor, clip: float = 10.0, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps), clipped to [-clip, clip]."""
    return ((x - rms["mean"]) / torch.sqrt(rms["var"] + eps)).clamp(-clip, clip)
