"""Pure loss terms for policy-gradient, value, Q-learning, distributional and actor-critic RL.

Written in rlax's discipline:

- arguments are time-major / batch-leading tensors `[...]` with any number of batch
  dims (`[T, B]`, `[N]`, or per-example shapes under `torch.func.vmap`);
- every function returns UNREDUCED per-element values; masking with `valid` and
  reducing (mean / sum) is the caller's job;
- no `.item()`, no Python control flow on tensor values, no in-place writes to the
  inputs, so each function compiles with `torch.compile(fullgraph=True)`, and works
  under `torch.func.vmap` and `torch.func.grad`;
- targets (advantages, returns, bootstrapped TD targets, behaviour log-probs) are
  detached inside the function, so `loss.mean().backward()` only moves what the
  loss is meant to move;
- hyperparameters (clip range, coefficients, temperature, Huber delta) may be Python
  floats or 0-d tensors (tensors in the train state, possibly vmapped over a
  hyperparameter sweep); both give the same values.

Notation: `r = exp(logp - old_logp)` is the importance ratio of the new policy to the
behaviour policy; `...` stands for any batch shape.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from fnrl.checks import check_float, check_same_shape

__all__ = [
    # policy gradient family
    "policy_gradient_loss",
    "clipped_surrogate_loss",
    "kl_penalty_loss",
    "adaptive_kl_coef",
    "approx_kl",
    "entropy_loss",
    # value losses
    "squared_loss",
    "huber_loss",
    "clipped_value_loss",
    # Q-learning family
    "q_learning_td",
    "double_q_learning_td",
    "categorical_projection",
    "categorical_q_target",
    "categorical_cross_entropy",
    "categorical_td_loss",
    "quantile_huber_loss",
    "quantile_midpoints",
    # deterministic / soft actor-critic
    "dpg_loss",
    "td3_target_action",
    "twin_q_target",
    "sac_actor_loss",
    "sac_temperature_loss",
]

Scalar = Union[float, torch.Tensor]
"""A hyperparameter: a Python number or a 0-d floating-point tensor."""


# ---------------------------------------------------------------------------
# Private checks and helpers (static metadata only: free under compile / vmap)
# ---------------------------------------------------------------------------


def _check_scalar(**scalars: Scalar) -> None:
    """Raise unless each value is a Python int/float or a 0-d floating-point tensor."""
    for name, x in scalars.items():
        if torch.is_tensor(x):
            if not x.is_floating_point():
                raise ValueError(f"{name} must be a float or a 0-d floating-point tensor, got dtype {x.dtype}")
            if x.ndim != 0:
                raise ValueError(f"{name} must be a float or a 0-d tensor, got shape {tuple(x.shape)}")
        elif isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"{name} must be a float or a 0-d floating-point tensor, got {type(x).__name__}")


def _check_index(**tensors: torch.Tensor) -> None:
    """Raise unless each tensor holds int64 action indices."""
    for name, x in tensors.items():
        if not torch.is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.int64:
            raise ValueError(f"{name} must be an int64 tensor of action indices, got dtype {x.dtype}")


def _check_trailing(name: str, x: torch.Tensor, batch: torch.Size, layout: str) -> None:
    """Raise unless `x` is `[*batch, K]` for some K (a distribution or Q-values over a last axis)."""
    if x.ndim != len(batch) + 1 or x.shape[:-1] != batch:
        raise ValueError(f"{name} must have shape {layout} with leading dims {tuple(batch)}, got {tuple(x.shape)}")


def _const(x: Scalar) -> Scalar:
    """A hyperparameter or target seen as a constant: tensors are detached."""
    return x.detach() if torch.is_tensor(x) else x


def _clamp(x: torch.Tensor, low: Scalar, high: Scalar) -> torch.Tensor:
    """min(max(x, low), high) for any mix of Python numbers and tensors as bounds."""
    return torch.clamp(torch.clamp(x, min=low), max=high)


def _select(values: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """values[..., action] along the action axis: values [..., A] -> [...]."""
    return torch.gather(values, -1, action.unsqueeze(-1)).squeeze(-1)


def _select_dist(dists: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """dists[..., action, :]: per-action distributions [..., A, N] -> [..., N]."""
    index = action[..., None, None].expand(*action.shape, 1, dists.shape[-1])
    return torch.gather(dists, -2, index).squeeze(-2)


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp(logp - old_logp.detach())


def _check_logp_pair(logp: torch.Tensor, old_logp: torch.Tensor, **more: torch.Tensor) -> None:
    check_float(logp=logp, old_logp=old_logp, **more)
    check_same_shape(logp=logp, old_logp=old_logp, **more)


# ---------------------------------------------------------------------------
# Policy gradient family
# ---------------------------------------------------------------------------


def policy_gradient_loss(logp: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """REINFORCE / actor-critic policy-gradient loss (Williams 1992; Sutton et al. 2000).

    L = -log pi(a | s) * A,   with A treated as a constant (detached),

    so that grad L = -A grad log pi(a | s), the score-function estimator.

    logp: [...] log-probability of the taken action under the current policy.
    advantage: [...] advantage (or return) estimate.
    Returns [...].
    """
    check_float(logp=logp, advantage=advantage)
    check_same_shape(logp=logp, advantage=advantage)
    return -logp * advantage.detach()


def clipped_surrogate_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, clip: Scalar
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate objective, negated (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

    r = exp(logp - old_logp),
    L = -min(r A, clip(r, 1 - eps, 1 + eps) A),     eps = `clip`.

    The gradient is zero where the ratio has already moved past the clip range in the
    direction that improves the objective (r > 1 + eps with A > 0, r < 1 - eps with A < 0).

    logp: [...] log pi(a|s) under the current policy (differentiated).
    old_logp: [...] log-probability under the behaviour policy (detached).
    advantage: [...] advantage estimate (detached).
    clip: float or 0-d tensor, the clip range eps.
    Returns (loss [...], clipped [...]) where `clipped` is 1.0 where |r - 1| > eps and
    0.0 elsewhere (in logp's dtype, no gradient); its mean is the usual clip fraction.
    """
    _check_logp_pair(logp, old_logp, advantage=advantage)
    _check_scalar(clip=clip)
    clip = _const(clip)
    advantage = advantage.detach()
    ratio = _ratio(logp, old_logp)
    surrogate = ratio * advantage
    # Where the clipped term is the smaller one, r is past the range and the term's gradient is
    # zero: it is a constant, and the minimum a `where` that passes the gradient through r A
    # wherever r A is not larger. The same numbers as `torch.minimum` (whose gradient's halves at
    # ties add up to this) with fewer autograd records.
    clipped_surrogate = _clamp(ratio.detach(), 1 - clip, 1 + clip) * advantage
    loss = -torch.where(surrogate.detach() <= clipped_surrogate, surrogate, clipped_surrogate)
    clipped = ((ratio.detach() - 1).abs() > clip).to(logp.dtype)
    return loss, clipped


def kl_penalty_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, kl: torch.Tensor, beta: Scalar
) -> torch.Tensor:
    """PPO with an (adaptive) KL penalty, negated (Schulman et al. 2017, arXiv:1707.06347, sec. 4;
    BatchPPO, Hafner et al. 2017).

    L = -r A + beta * KL(pi_old || pi),   r = exp(logp - old_logp).

    logp: [...] log pi(a|s) under the current policy (differentiated).
    old_logp: [...] behaviour log-probability (detached).
    advantage: [...] advantage estimate (detached).
    kl: [...] per-element KL(pi_old || pi) supplied by the caller (exact, or `approx_kl`);
        differentiated, so the penalty pulls the new policy back.
    beta: float or 0-d tensor, the penalty coefficient (detached; adapt it with
        `adaptive_kl_coef`).
    Returns [...].
    """
    _check_logp_pair(logp, old_logp, advantage=advantage, kl=kl)
    _check_scalar(beta=beta)
    return -_ratio(logp, old_logp) * advantage.detach() + _const(beta) * kl


def adaptive_kl_coef(
    beta: Scalar, kl_mean: torch.Tensor, kl_target: Scalar, factor: Scalar = 1.5, scale: Scalar = 2.0
) -> torch.Tensor:
    """Adaptive KL coefficient update (Schulman et al. 2017, arXiv:1707.06347, sec. 4).

    beta' = beta * scale   if kl_mean > factor * kl_target,
            beta / scale   if kl_mean < kl_target / factor,
            beta           otherwise.

    beta: float or 0-d tensor, the current coefficient.
    kl_mean: [...] floating tensor, the measured mean KL (usually 0-d; a batch of them
        under a hyperparameter sweep).
    kl_target, factor, scale: floats or 0-d tensors (the paper uses 1.5 and 2).
    Returns the new coefficient as a detached tensor of kl_mean's shape and dtype.
    """
    check_float(kl_mean=kl_mean)
    _check_scalar(beta=beta, kl_target=kl_target, factor=factor, scale=scale)
    kl_mean = kl_mean.detach()
    beta = _const(beta)
    if not torch.is_tensor(beta):
        beta = torch.as_tensor(beta, dtype=kl_mean.dtype, device=kl_mean.device)
    kl_target, factor, scale = _const(kl_target), _const(factor), _const(scale)
    beta = beta.to(kl_mean.dtype)
    too_far = kl_mean > factor * kl_target
    too_close = kl_mean < kl_target / factor
    return torch.where(too_far, beta * scale, torch.where(too_close, beta / scale, beta))


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per-sample estimator of KL(pi_old || pi) (Schulman 2020, "Approximating KL divergence", k3).

    k3 = (r - 1) - log r,   r = exp(logp - old_logp),   with a ~ pi_old.

    Unbiased (E_{a~pi_old}[r] = 1), non-negative per sample and low-variance.
    Differentiable in `logp`; `old_logp` is detached.

    logp: [...] log pi(a|s) under the current policy.
    old_logp: [...] log-probability under the behaviour policy (the sampler).
    Returns [...].
    """
    _check_logp_pair(logp, old_logp)
    log_ratio = logp - old_logp.detach()
    return torch.expm1(log_ratio) - log_ratio


def entropy_loss(entropy: torch.Tensor) -> torch.Tensor:
    """Entropy bonus as a loss (Williams & Peng 1991; Mnih et al. 2016, A3C): L = -H(pi(.|s)).

    entropy: [...] per-state policy entropy. Returns [...]; scale by the coefficient.
    """
    check_float(entropy=entropy)
    return -entropy


# ---------------------------------------------------------------------------
# Value losses
# ---------------------------------------------------------------------------


def squared_loss(x: torch.Tensor) -> torch.Tensor:
    """Squared (L2) loss of an error: L = 0.5 x^2, so that dL/dx = x.

    x: [...] error, e.g. a TD error or `value - return`. Returns [...].
    """
    check_float(x=x)
    return 0.5 * x.square()


def huber_loss(x: torch.Tensor, delta: Scalar = 1.0) -> torch.Tensor:
    """Huber loss of an error (Huber 1964; used in DQN, Mnih et al. 2015).

    L = 0.5 x^2                  if |x| <= delta,
        delta (|x| - 0.5 delta)  otherwise,

    computed branch-free as 0.5 q^2 + delta (|x| - q) with q = min(|x|, delta).
    Its gradient is x clipped to [-delta, delta].

    x: [...] error. delta: float or 0-d tensor > 0. Returns [...].
    """
    check_float(x=x)
    _check_scalar(delta=delta)
    delta = _const(delta)
    abs_x = x.abs()
    quadratic = torch.clamp(abs_x, max=delta)
    return 0.5 * quadratic.square() + delta * (abs_x - quadratic)


def clipped_value_loss(
    value: torch.Tensor, old_value: torch.Tensor, target: torch.Tensor, clip: Scalar
) -> torch.Tensor:
    """PPO's clipped value loss (Schulman et al. 2017 baselines code; Engstrom et al. 2020).

    v_clip = old_v + clip(v - old_v, -eps, eps),
    L = 0.5 max((v - G)^2, (v_clip - G)^2),     eps = `clip`.

    value: [...] current value estimate (differentiated).
    old_value: [...] value estimate recorded by the behaviour policy (detached).
    target: [...] return target G (detached).
    clip: float or 0-d tensor, the clip range eps.
    Returns [...].
    """
    check_float(value=value, old_value=old_value, target=target)
    check_same_shape(value=value, old_value=old_value, target=target)
    _check_scalar(clip=clip)
    clip = _const(clip)
    old_value, target = old_value.detach(), target.detach()
    value_clipped = old_value + _clamp(value - old_value, -clip, clip)
    return 0.5 * torch.maximum((value - target).square(), (value_clipped - target).square())


# ---------------------------------------------------------------------------
# Q-learning family
# ---------------------------------------------------------------------------


def _check_q_args(q, action, reward, discount, **next_qs) -> None:
    check_float(q=q, reward=reward, discount=discount, **next_qs)
    _check_index(action=action)
    check_same_shape(action=action, reward=reward, discount=discount)
    _check_trailing("q", q, action.shape, "[..., A]")
    check_same_shape(q=q, **next_qs)


def q_learning_td(
    q: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, next_q_target: torch.Tensor
) -> torch.Tensor:
    """Q-learning TD error (Watkins 1989; DQN, Mnih et al. 2015).

    td = r + discount * max_a' Q_target(s', a') - Q(s, a),   target part detached.

    q: [..., A] Q-values of the current state (differentiated).
    action: [...] int64 action taken.
    reward: [...] reward.
    discount: [...] gamma^n * (1 - terminated), 0 at terminal states.
    next_q_target: [..., A] target-network Q-values of the next state.
    Returns the TD error [...]; feed it to `squared_loss` or `huber_loss`.
    """
    _check_q_args(q, action, reward, discount, next_q_target=next_q_target)
    target = reward + discount * next_q_target.amax(dim=-1)
    return target.detach() - _select(q, action)


def double_q_learning_td(
    q: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor,
) -> torch.Tensor:
    """Double Q-learning TD error (van Hasselt et al. 2016, arXiv:1509.06461).

    a* = argmax_a' Q_online(s', a'),
    td = r + discount * Q_target(s', a*) - Q(s, a),   target part detached.

    q: [..., A] Q-values of the current state (differentiated).
    action: [...] int64 action taken.
    reward, discount: [...] as in `q_learning_td`.
    next_q_target: [..., A] target-network Q-values of the next state (evaluate).
    next_q_online: [..., A] online-network Q-values of the next state (select).
    Returns the TD error [...]. Equals `q_learning_td` when next_q_online == next_q_target.
    """
    _check_q_args(q, action, reward, discount, next_q_target=next_q_target, next_q_online=next_q_online)
    next_action = next_q_online.argmax(dim=-1)
    target = reward + discount * _select(next_q_target, next_action)
    return target.detach() - _select(q, action)


def categorical_projection(support: torch.Tensor, probs: torch.Tensor, target_support: torch.Tensor) -> torch.Tensor:
    """Project a categorical distribution onto a fixed, evenly spaced support (C51:
    Bellemare et al. 2017, arXiv:1707.06887, Algorithm 1).

    Each atom z_i (clipped to [v_min, v_max]) sends its mass p_i to its two nearest target
    atoms, in proportion to closeness:

    b_i = (clip(z_i, v_min, v_max) - v_min) / dz,   dz = (v_max - v_min) / (M - 1),
    m_j = sum_i p_i * clamp(1 - |b_i - j|, 0, 1),   j = 0..M-1,

    which is Algorithm 1 written without a loop over atoms (and without its lost-mass
    corner case when z_i falls exactly on a target atom). Total mass is preserved, and the
    projection is the identity when support == target_support. Memory is [..., N, M].

    support: [..., N] atom locations, already shifted/scaled (e.g. r + discount * z);
        its batch dims broadcast with those of `probs` (a plain [N] support is fine).
    probs: [..., N] probabilities of those atoms.
    target_support: [M] fixed, evenly spaced, increasing atoms (M >= 2); its ends are
        v_min and v_max.
    Returns [...] + [M] projected probabilities (batch dims broadcast). Not detached.
    """
    check_float(support=support, probs=probs, target_support=target_support)
    if target_support.ndim != 1 or target_support.shape[0] < 2:
        raise ValueError(f"target_support must have shape [M] with M >= 2, got {tuple(target_support.shape)}")
    if support.ndim < 1 or probs.ndim < 1 or support.shape[-1] != probs.shape[-1]:
        raise ValueError(
            f"support has shape {tuple(support.shape)} and probs has shape {tuple(probs.shape)}; "
            f"expected support [..., N] and probs [..., N] with the same number of atoms N"
        )
    try:
        torch.broadcast_shapes(support.shape[:-1], probs.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"support batch dims {tuple(support.shape[:-1])} do not broadcast with probs batch dims "
            f"{tuple(probs.shape[:-1])}"
        ) from None
    num_atoms = target_support.shape[0]
    v_min, v_max = target_support[0], target_support[-1]
    delta_z = (v_max - v_min) / (num_atoms - 1)
    # source atoms in target-index units, b_i in [0, M - 1]: [..., N]
    position = (_clamp(support, v_min, v_max) - v_min) / delta_z
    index = torch.arange(num_atoms, dtype=position.dtype, device=position.device)
    # |b_i - j| for every source atom i and target atom j: [..., N, M]
    distance = (position.unsqueeze(-1) - index).abs()
    weight = torch.clamp(1 - distance, min=0)
    return (probs.unsqueeze(-1) * weight).sum(dim=-2)


def categorical_q_target(
    reward: torch.Tensor, discount: torch.Tensor, next_probs: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51 target distribution (Bellemare et al. 2017, arXiv:1707.06887, Algorithm 1).

    Phi( r + discount * z ; p(s', a*) ), the next-state distribution shifted by the reward,
    scaled by the discount and projected back onto `support` by `categorical_projection`.
    At a terminal step (discount 0) all mass lands on r (clipped to the support).

    reward: [...] reward.
    discount: [...] gamma^n * (1 - terminated).
    next_probs: [..., N] target-network probabilities of the bootstrap action a*.
    support: [N] fixed evenly spaced atoms z.
    Returns the detached target probabilities [..., N].
    """
    check_float(reward=reward, discount=discount, next_probs=next_probs, support=support)
    check_same_shape(reward=reward, discount=discount)
    _check_trailing("next_probs", next_probs, reward.shape, "[..., N]")
    atoms = reward.unsqueeze(-1) + discount.unsqueeze(-1) * support
    return categorical_projection(atoms, next_probs, support).detach()


def categorical_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a categorical prediction against a fixed target distribution
    (the C51 loss, Bellemare et al. 2017, arXiv:1707.06887).

    L = -sum_j m_j log softmax(logits)_j,   m = target_probs (detached).

    Its gradient with respect to the logits is softmax(logits) - m.

    logits: [..., N] predicted logits (differentiated).
    target_probs: [..., N] target probabilities, e.g. from `categorical_q_target`.
    Returns [...].
    """
    check_float(logits=logits, target_probs=target_probs)
    check_same_shape(logits=logits, target_probs=target_probs)
    return -(target_probs.detach() * torch.log_softmax(logits, dim=-1)).sum(dim=-1)


def categorical_td_loss(
    logits: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_probs_target: torch.Tensor,
    next_action: torch.Tensor,
    support: torch.Tensor,
) -> torch.Tensor:
    """C51 distributional Q-learning loss (Bellemare et al. 2017, arXiv:1707.06887, Algorithm 1).

    L = CE( Phi(r + discount * z ; p_target(s', a*)),  softmax(logits(s, a)) ),

    the composition `categorical_cross_entropy(logits[a], categorical_q_target(...))`.
    The caller picks the bootstrap action a* = `next_action`: the greedy action of the
    target network's mean Q (C51), or of the online network (double DQN, Rainbow).

    logits: [..., A, N] per-action logits of the current state (differentiated).
    action: [...] int64 action taken.
    reward, discount: [...] as in `q_learning_td`.
    next_probs_target: [..., A, N] target-network per-action probabilities at s'.
    next_action: [...] int64 bootstrap action a*.
    support: [N] fixed evenly spaced atoms z.
    Returns [...].
    """
    check_float(logits=logits, next_probs_target=next_probs_target)
    _check_index(action=action, next_action=next_action)
    check_same_shape(action=action, next_action=next_action, reward=reward, discount=discount)
    if logits.ndim != action.ndim + 2 or logits.shape[:-2] != action.shape:
        raise ValueError(f"logits must have shape [..., A, N] with leading dims {tuple(action.shape)}, "
                         f"got {tuple(logits.shape)}")
    check_same_shape(logits=logits, next_probs_target=next_probs_target)
    target = categorical_q_target(reward, discount, _select_dist(next_probs_target, next_action), support)
    return categorical_cross_entropy(_select_dist(logits, action), target)


def quantile_huber_loss(pred: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa: Scalar = 1.0) -> torch.Tensor:
    """Quantile Huber loss (QR-DQN, Dabney et al. 2018, arXiv:1710.10044; IQN,
    Dabney et al. 2018, arXiv:1806.06923, whose kappa-normalised form this is).

    u_ij = target_j - pred_i,
    rho_tau(u) = |tau - 1{u < 0}| * Huber_kappa(u) / kappa,
    L = sum_i mean_j rho_{tau_i}(u_ij).

    pred: [..., N] quantile estimates at fractions `taus` (differentiated).
    target: [..., M] target samples / quantiles (detached); same batch dims as pred.
    taus: [..., N] or [N] quantile fractions in (0, 1) (detached); e.g. `quantile_midpoints(N)`
        for QR-DQN, uniform samples for IQN.
    kappa: float or 0-d tensor > 0, the Huber threshold.
    Returns the per-example loss [...]. Memory is [..., N, M].
    """
    check_float(pred=pred, target=target, taus=taus)
    _check_scalar(kappa=kappa)
    if isinstance(kappa, (int, float)) and kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    if pred.ndim < 1 or target.ndim < 1 or pred.shape[:-1] != target.shape[:-1]:
        raise ValueError(f"target must have shape [..., M] with the batch dims of pred {tuple(pred.shape)}, "
                         f"got {tuple(target.shape)}")
    if taus.shape != pred.shape and taus.shape != pred.shape[-1:]:
        raise ValueError(f"taus must have shape [..., N] = {tuple(pred.shape)} or [N] = {tuple(pred.shape[-1:])}, "
                         f"got {tuple(taus.shape)}")
    kappa = _const(kappa)
    u = target.detach().unsqueeze(-2) - pred.unsqueeze(-1)  # [..., N, M]
    weight = (taus.detach().unsqueeze(-1) - (u.detach() < 0).to(u.dtype)).abs()
    return (weight * huber_loss(u, kappa) / kappa).mean(dim=-1).sum(dim=-1)


def quantile_midpoints(n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Quantile midpoints tau_i = (2i + 1) / (2n), i = 0..n-1 (QR-DQN, Dabney et al. 2018,
    arXiv:1710.10044, Lemma 2: the fractions that minimise the 1-Wasserstein error).

    n: number of quantiles (Python int >= 1). Returns [n].
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    return (2 * torch.arange(n, dtype=dtype, device=device) + 1) / (2 * n)


# ---------------------------------------------------------------------------
# Deterministic and soft actor-critic
# ---------------------------------------------------------------------------


def dpg_loss(q: torch.Tensor) -> torch.Tensor:
    """Deterministic policy-gradient actor loss (Silver et al. 2014; DDPG, Lillicrap et al. 2016,
    arXiv:1509.02971; TD3, Fujimoto et al. 2018).

    L = -Q(s, mu(s)),   so grad_theta L = -grad_a Q(s, a)|_{a = mu(s)} grad_theta mu(s).

    The caller evaluates q = Q(s, mu(s)) with the critic's parameters held fixed (only
    the actor's parameters are optimised with this loss).

    q: [...] critic value of the actor's action. Returns [...].
    """
    check_float(q=q)
    return -q


def td3_target_action(
    next_action: torch.Tensor, noise_std: Scalar, noise_clip: Scalar, low: Scalar, high: Scalar
) -> torch.Tensor:
    """TD3 target policy smoothing (Fujimoto et al. 2018, arXiv:1802.09477, sec. 5.3).

    a' = clip(mu_target(s') + clip(eps, -c, c), low, high),   eps ~ N(0, sigma^2).

    Noise is drawn with `torch.randn_like` (use `vmap(..., randomness="different")` for
    independent noise per vmapped example). With sigma = 0 the result is `next_action`
    clipped to [low, high].

    next_action: [..., act_dim] target actor's action at s'.
    noise_std: float or 0-d tensor sigma. noise_clip: float or 0-d tensor c.
    low, high: floats or tensors broadcastable to next_action (e.g. [act_dim]), the
        action bounds.
    Returns the detached smoothed target action [..., act_dim].
    """
    check_float(next_action=next_action)
    _check_scalar(noise_std=noise_std, noise_clip=noise_clip)
    for name, bound in (("low", low), ("high", high)):
        if torch.is_tensor(bound):
            check_float(**{name: bound})
            try:
                torch.broadcast_shapes(bound.shape, next_action.shape)
            except RuntimeError:
                raise ValueError(f"{name} of shape {tuple(bound.shape)} does not broadcast to next_action "
                                 f"of shape {tuple(next_action.shape)}") from None
        else:
            _check_scalar(**{name: bound})
    noise_clip = _const(noise_clip)
    noise = _clamp(torch.randn_like(next_action) * _const(noise_std), -noise_clip, noise_clip)
    return _clamp(next_action.detach() + noise, _const(low), _const(high))


def twin_q_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_logp: Optional[torch.Tensor] = None,
    alpha: Scalar = 0.0,
) -> torch.Tensor:
    """Clipped double-Q target (TD3, Fujimoto et al. 2018, arXiv:1802.09477, sec. 4.2) and its soft
    version (SAC, Haarnoja et al. 2018, arXiv:1812.05905, with clipped double Q).

    y = r + discount * (min(Q1'(s', a'), Q2'(s', a')) - alpha * log pi(a'|s')),

    with the entropy term dropped when `next_logp` is None (TD3).

    reward: [...] reward. discount: [...] gamma * (1 - terminated).
    next_q1, next_q2: [...] target critics at (s', a').
    next_logp: [...] log pi(a'|s') of the sampled next action, or None.
    alpha: float or 0-d tensor, the entropy temperature.
    Returns the detached target y [...].
    """
    check_float(reward=reward, discount=discount, next_q1=next_q1, next_q2=next_q2)
    check_same_shape(reward=reward, discount=discount, next_q1=next_q1, next_q2=next_q2)
    _check_scalar(alpha=alpha)
    next_value = torch.minimum(next_q1, next_q2)
    if next_logp is not None:
        check_float(next_logp=next_logp)
        check_same_shape(reward=reward, next_logp=next_logp)
        next_value = next_value - _const(alpha) * next_logp
    return (reward + discount * next_value).detach()


def sac_actor_loss(logp: torch.Tensor, q: torch.Tensor, alpha: Scalar) -> torch.Tensor:
    """Soft actor-critic policy loss (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905).

    L = alpha * log pi(a|s) - Q(s, a),   a = f(eps; s) reparameterised, alpha detached.

    logp: [...] log pi(a|s) of the reparameterised action.
    q: [...] critic value at (s, a) (e.g. min of the twin critics), differentiable in a.
    alpha: float or 0-d tensor, the temperature (detached).
    Returns [...].
    """
    check_float(logp=logp, q=q)
    check_same_shape(logp=logp, q=q)
    _check_scalar(alpha=alpha)
    return _const(alpha) * logp - q


def sac_temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: Scalar) -> torch.Tensor:
    """Automatic entropy tuning (Haarnoja et al. 2018b, arXiv:1812.05905, sec. 5).

    L = -log_alpha * (log pi(a|s) + H_target),   (log pi + H_target) detached.

    Parameterised by log alpha (as in the authors' code), so that gradient descent
    raises alpha while the policy entropy is below the target H_target.

    log_alpha: 0-d (or [...]-broadcastable) floating tensor, the learned log temperature.
    logp: [...] log pi(a|s) of actions sampled from the current policy.
    target_entropy: float or 0-d tensor H_target (commonly -act_dim).
    Returns [...].
    """
    check_float(log_alpha=log_alpha, logp=logp)
    _check_scalar(target_entropy=target_entropy)
    try:
        torch.broadcast_shapes(log_alpha.shape, logp.shape)
    except RuntimeError:
        raise ValueError(f"log_alpha of shape {tuple(log_alpha.shape)} does not broadcast with logp "
                         f"of shape {tuple(logp.shape)}") from None
    return -log_alpha * (logp + _const(target_entropy)).detach()
