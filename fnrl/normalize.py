"""Running mean / variance statistics as pure functions over a small TensorDict.

Used for BatchPPO's observation and reward normalization (PPO, A2C, the Q-function policy
gradients' observations). The statistics live in the train state, so they are checkpointed,
vmapped over seeds and compiled like the rest.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

from fnrl.returns import reverse_linear_recurrence


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


def forward_return(reward: torch.Tensor, done: torch.Tensor, gamma, carry: torch.Tensor):
    """Per-env discounted return R_t = r_t + c_{t-1} R_{t-1}, c_t = gamma (1 - done_t), R_{-1} c_{-1} = carry.

    A forward recurrence, computed with the reverse scan on the time-flipped sequence.
    reward, done: [T, B]; carry: [B]. Returns (R [T, B], the carry for the next rollout [B]).
    """
    decay = gamma * (~done).to(reward.dtype)
    b = torch.cat([reward[:1] + carry, reward[1:]])
    ret = reverse_linear_recurrence(b.flip(0), decay.flip(0).roll(-1, 0)).flip(0)
    return ret, decay[-1] * ret[-1]


def scale_rewards(rew_rms: TensorDict, ret: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
                  valid: torch.Tensor, gamma):
    """BatchPPO's reward scaling (Hafner et al. 2017, arXiv:1709.02878; stable-baselines3's
    VecNormalize): r_t / sqrt(Var[R] + 1e-8), with R the running per-env discounted return
    (`forward_return`) and Var[R] its running variance over the valid steps.

    reward, done, valid: [T, B]; rew_rms: `rms_init(())`; ret: [B], the returns carried from the
    previous rollout. Returns (scaled reward [T, B], new rew_rms, new ret).
    """
    returns, ret = forward_return(reward, done, gamma, ret)
    rew_rms = rms_update(rew_rms, returns.reshape(-1), valid.reshape(-1))
    return reward / torch.sqrt(rew_rms["var"] + 1e-8), rew_rms, ret
