"""Action distributions as pure functions over their parameter tensors.

No `torch.distributions` objects: each distribution is the tensors that define it
(categorical logits, Gaussian mean and log-std) and each operation is a function of
them. Everything here has no Python branching on tensor values, no `.item()` and no
in-place writes, so it works under `torch.func.vmap` (sampling needs
`randomness="different"` or `"same"`), `torch.func.grad` and
`torch.compile(fullgraph=True)`.

Shapes: a categorical over A actions has logits [..., A] and actions int64 [...];
a diagonal Gaussian over D dims has mean and log_std [..., D], and log-probabilities,
entropies and KLs are summed over D, giving [...]; a multi-categorical over K parts of
nvec[k] choices has logits [..., sum(nvec)] and actions int64 [..., K], its log-probabilities,
entropies and KLs summed over the parts.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fnrl.checks import check_float, check_min_rank, check_same_shape

__all__ = [
    "categorical_sample",
    "categorical_log_prob",
    "categorical_entropy",
    "categorical_kl",
    "categorical_mode",
    "epsilon_greedy",
    "epsilon_greedy_probs",
    "normal_sample",
    "normal_log_prob",
    "normal_entropy",
    "normal_kl",
    "normal_mode",
    "tanh_normal_sample",
    "tanh_normal_log_prob",
    "tanh_normal_mode",
    "sde_log_std",
    "sde_noise",
    "multi_categorical_sample",
    "multi_categorical_log_prob",
    "multi_categorical_entropy",
    "multi_categorical_kl",
    "multi_categorical_mode",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


# ---------------------------------------------------------------------------
# private helpers
# ---------------------------------------------------------------------------


def _check_logits(name: str, logits: torch.Tensor) -> None:
    check_float(**{name: logits})
    check_min_rank(name, logits, 1, "[..., A]")


def _check_action_index(action: torch.Tensor, logits: torch.Tensor) -> None:
    """Raise unless `action` is an int64 tensor of shape logits.shape[:-1]."""
    if not torch.is_tensor(action) or action.dtype != torch.int64:
        got = action.dtype if torch.is_tensor(action) else type(action).__name__
        raise ValueError(f"action must be an int64 tensor of action indices, got {got}")
    if action.shape != logits.shape[:-1]:
        raise ValueError(
            f"action must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}, got {tuple(action.shape)}"
        )


def _finite_log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax with -inf (masked actions) replaced by the dtype's lowest finite value.

    Then `p * log p` is 0 rather than NaN where p = 0 (as torch.distributions does).
    """
    return torch.log_softmax(logits, dim=-1).clamp(min=torch.finfo(logits.dtype).min)


def _uniform_index(like: torch.Tensor, num_actions: int) -> torch.Tensor:
    """Uniform random index in [0, num_actions), int64, with the shape of `like`."""
    u = torch.rand_like(like)
    return (u * num_actions).floor().clamp(max=num_actions - 1).to(torch.int64)


def _as_probability(epsilon, like: torch.Tensor) -> torch.Tensor:
    """Epsilon as a tensor of `like`'s dtype and device (from a float, 0-d or batch tensor)."""
    if torch.is_tensor(epsilon):
        return epsilon.to(dtype=like.dtype, device=like.device)
    return torch.full((), float(epsilon), dtype=like.dtype, device=like.device)


def _tanh_log_abs_det_jacobian(pre_tanh: torch.Tensor) -> torch.Tensor:
    """sum_d log(1 - tanh(u_d)^2) = sum_d 2 (log 2 - u_d - softplus(-2 u_d)).

    The right-hand form stays finite for any |u| (the left one is log 0 past |u| ~ 9
    in float32). pre_tanh: [..., D]; returns [...].
    """
    return (2.0 * (_LOG_2 - pre_tanh - F.softplus(-2.0 * pre_tanh))).sum(-1)


# ---------------------------------------------------------------------------
# categorical
# ---------------------------------------------------------------------------


def categorical_sample(logits: torch.Tensor) -> torch.Tensor:
    """Sample a ~ Categorical(softmax(logits)) with the Gumbel-max trick.

    a = argmax_i (logits_i - log(-log U_i)),  U_i ~ Uniform(0, 1) i.i.d.
    (Gumbel 1954; Maddison et al. 2014, "A* Sampling"). Masked actions (logit -inf)
    are never drawn.

    logits: [..., A] float. Returns int64 [...].
    """
    _check_logits("logits", logits)
    u = torch.rand_like(logits).clamp(min=torch.finfo(logits.dtype).tiny)
    return torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)


def categorical_log_prob(logits: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log pi(a) = logits_a - logsumexp(logits).

    logits: [..., A] float; action: int64 [...]. Returns [...].
    """
    _check_logits("logits", logits)
    _check_action_index(action, logits)
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(pi) = -sum_a pi(a) log pi(a); actions with logit -inf contribute 0.

    logits: [..., A] float. Returns [...].
    """
    _check_logits("logits", logits)
    log_p = _finite_log_softmax(logits)
    return -(log_p.exp() * log_p).sum(-1)


def categorical_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_a p(a) (log p(a) - log q(a)).

    p_logits, q_logits: [..., A] float, same shape. Returns [...].
    """
    _check_logits("p_logits", p_logits)
    check_same_shape(p_logits=p_logits, q_logits=q_logits)
    log_p = _finite_log_softmax(p_logits)
    log_q = _finite_log_softmax(q_logits)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def categorical_mode(logits: torch.Tensor) -> torch.Tensor:
    """The most probable action argmax_a logits_a (first one on ties).

    logits: [..., A]. Returns int64 [...].
    """
    _check_logits("logits", logits)
    return torch.argmax(logits, dim=-1)


# ---------------------------------------------------------------------------
# epsilon-greedy over action values
# ---------------------------------------------------------------------------


def epsilon_greedy(q: torch.Tensor, epsilon) -> torch.Tensor:
    """Epsilon-greedy action (Mnih et al. 2015, DQN).

    a = uniform random action    with probability epsilon,
        argmax_a q(a)             otherwise,
    so pi(a) = epsilon / A + (1 - epsilon) [a = argmax q] (see `epsilon_greedy_probs`).

    q: [..., A] float action values. epsilon: a float, a 0-d tensor, or a tensor
    broadcastable to [...] (one epsilon per env, as in rlpyt's vector epsilon).
    Returns int64 [...].
    """
    _check_logits("q", q)
    greedy = torch.argmax(q, dim=-1)
    random_action = _uniform_index(q[..., 0], q.shape[-1])
    explore = torch.rand_like(q[..., 0]) < _as_probability(epsilon, q)
    return torch.where(explore, random_action, greedy)


def epsilon_greedy_probs(q: torch.Tensor, epsilon) -> torch.Tensor:
    """Action probabilities of `epsilon_greedy`.

    pi(a) = epsilon / A + (1 - epsilon) [a = argmax q]   (first argmax on ties).

    q: [..., A] float; epsilon: float, 0-d tensor or tensor broadcastable to [...].
    Returns [..., A] (the broadcast of q with epsilon[..., None]).
    """
    _check_logits("q", q)
    num_actions = q.shape[-1]
    eps = _as_probability(epsilon, q).unsqueeze(-1)
    is_greedy = torch.arange(num_actions, device=q.device) == torch.argmax(q, dim=-1, keepdim=True)
    return eps / num_actions + (1.0 - eps) * is_greedy.to(q.dtype)


# ---------------------------------------------------------------------------
# diagonal Gaussian
# ---------------------------------------------------------------------------


def normal_sample(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Reparameterized sample x = mean + exp(log_std) * e,  e ~ N(0, I).

    Gradients flow to mean and log_std (rsample). mean, log_std: [..., D] (log_std
    may be any shape broadcastable to mean, e.g. a state-independent [D]).
    Returns [..., D].
    """
    check_float(mean=mean, log_std=log_std)
    return mean + log_std.exp() * torch.randn_like(mean)


def normal_log_prob(mean: torch.Tensor, log_std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, diag(exp(log_std)^2)), summed over the last dim.

    log p(x) = sum_d [ -(x_d - mu_d)^2 / (2 sigma_d^2) - log sigma_d - log(2 pi) / 2 ].

    mean, log_std, x: [..., D] (broadcastable). Returns [...].
    """
    check_float(mean=mean, log_std=log_std, x=x)
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(-1)


def normal_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last dim.

    H = sum_d [ 1/2 + log(2 pi) / 2 + log sigma_d ]  (independent of the mean).

    log_std: [..., D]. Returns [...].
    """
    check_float(log_std=log_std)
    return (0.5 + _HALF_LOG_2PI + log_std).sum(-1)


def normal_kl(
    mean_p: torch.Tensor, log_std_p: torch.Tensor, mean_q: torch.Tensor, log_std_q: torch.Tensor
) -> torch.Tensor:
    """KL(p || q) between diagonal Gaussians, summed over the last dim.

    KL = sum_d [ log(sigma_q / sigma_p) + (sigma_p^2 + (mu_p - mu_q)^2) / (2 sigma_q^2) - 1/2 ].

    All arguments: [..., D] (broadcastable). Returns [...].
    """
    check_float(mean_p=mean_p, log_std_p=log_std_p, mean_q=mean_q, log_std_q=log_std_q)
    var_ratio = torch.exp(2.0 * (log_std_p - log_std_q))
    mean_term = ((mean_p - mean_q) * torch.exp(-log_std_q)).square()
    return (log_std_q - log_std_p + 0.5 * (var_ratio + mean_term) - 0.5).sum(-1)


def normal_mode(mean: torch.Tensor) -> torch.Tensor:
    """The mode (= mean) of a Gaussian; [..., D] -> [..., D]."""
    return mean


# ---------------------------------------------------------------------------
# tanh-squashed diagonal Gaussian (SAC)
# ---------------------------------------------------------------------------


def tanh_normal_log_prob(mean: torch.Tensor, log_std: torch.Tensor, pre_tanh: torch.Tensor) -> torch.Tensor:
    """log-density of a = tanh(u), u ~ N(mean, diag(exp(log_std)^2)), given u.

    log pi(a) = log N(u; mean, sigma) - sum_d log(1 - tanh(u_d)^2)
              = log N(u; mean, sigma) - sum_d 2 (log 2 - u_d - softplus(-2 u_d))
    (Haarnoja et al. 2018, SAC, arXiv:1801.01290, appendix C). The second form is
    finite for any |u|; pass the pre-tanh value, since atanh(a) loses it near |a| = 1.

    mean, log_std, pre_tanh: [..., D] (broadcastable). Returns [...].
    """
    return normal_log_prob(mean, log_std, pre_tanh) - _tanh_log_abs_det_jacobian(pre_tanh)


def tanh_normal_sample(mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reparameterized SAC action a = tanh(u), u = mean + exp(log_std) * e, e ~ N(0, I).

    Returns (action [..., D] in (-1, 1), log_prob [...]); both are differentiable in
    mean and log_std. See `tanh_normal_log_prob` for the density.
    """
    pre_tanh = normal_sample(mean, log_std)
    return torch.tanh(pre_tanh), tanh_normal_log_prob(mean, log_std, pre_tanh)


def tanh_normal_mode(mean: torch.Tensor) -> torch.Tensor:
    """Deterministic SAC action tanh(mean) (the tanh of the Gaussian's mode); [..., D]."""
    return torch.tanh(mean)


# ---------------------------------------------------------------------------
# generalized state-dependent exploration (gSDE)
# ---------------------------------------------------------------------------


def sde_log_std(latent: torch.Tensor, log_std: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Log-std of gSDE's Gaussian: sigma_d(s) = sqrt(sum_l z_l(s)^2 exp(log_std_ld)^2 + eps).

    gSDE (Raffin et al. 2022, arXiv:2005.05719) perturbs the action by z(s) @ (exp(log_std) * E)
    with features z(s) and a noise matrix E [L, D] of N(0, 1) entries: given s, a Gaussian of
    that std. The features enter detached (stable-baselines3's default: the std trains
    log_std alone, not the features).

    latent: [..., L], log_std: [L, D]. Returns [..., D].
    """
    check_float(latent=latent, log_std=log_std)
    variance = latent.detach().square() @ (2.0 * log_std).exp()
    return 0.5 * torch.log(variance + eps)


def sde_noise(latent: torch.Tensor, log_std: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """gSDE's exploration noise z(s) @ (exp(log_std) * E): a deterministic function of the state
    while the noise matrix E is held, so the perturbation is smooth along a trajectory.

    latent: [N, L] features (detached); log_std: [L, D]; matrix E: [N, L, D], one per env (the
    N rows of `latent`), or [L, D] shared by all rows. Returns [N, D].
    """
    check_float(latent=latent, log_std=log_std, matrix=matrix)
    scaled = log_std.exp() * matrix
    if scaled.dim() == 2:
        return latent.detach() @ scaled
    return torch.einsum("nl,nld->nd", latent.detach(), scaled)


# ---------------------------------------------------------------------------
# multi-categorical: independent categoricals over the parts of one action
# ---------------------------------------------------------------------------


def _parts(logits: torch.Tensor, nvec: tuple) -> tuple[torch.Tensor, ...]:
    _check_logits("logits", logits)
    if logits.shape[-1] != sum(nvec):
        raise ValueError(f"logits must have sum(nvec) = {sum(nvec)} entries in their last dim, got {logits.shape[-1]}")
    return torch.split(logits, list(nvec), dim=-1)


def multi_categorical_sample(logits: torch.Tensor, nvec: tuple) -> torch.Tensor:
    """a_k ~ Categorical(softmax(logits_k)) for each part k, independently (gymnasium's
    MultiDiscrete; OpenAI Baselines' MultiCategoricalPd).

    logits: [..., sum(nvec)], part k's logits the k-th block of nvec[k]. Returns int64 [..., K]."""
    return torch.stack([categorical_sample(part) for part in _parts(logits, nvec)], dim=-1)


def multi_categorical_log_prob(logits: torch.Tensor, nvec: tuple, action: torch.Tensor) -> torch.Tensor:
    """log pi(a) = sum_k log pi_k(a_k). action: int64 [..., K]. Returns [...]."""
    parts = _parts(logits, nvec)
    if action.shape[-1:] != (len(nvec),):
        raise ValueError(f"action must have K = {len(nvec)} parts in its last dim, got {tuple(action.shape)}")
    return sum(categorical_log_prob(part, action[..., k]) for k, part in enumerate(parts))


def multi_categorical_entropy(logits: torch.Tensor, nvec: tuple) -> torch.Tensor:
    """H(pi) = sum_k H(pi_k) (the parts are independent). Returns [...]."""
    return sum(categorical_entropy(part) for part in _parts(logits, nvec))


def multi_categorical_kl(p_logits: torch.Tensor, q_logits: torch.Tensor, nvec: tuple) -> torch.Tensor:
    """KL(p || q) = sum_k KL(p_k || q_k). Returns [...]."""
    return sum(categorical_kl(p, q) for p, q in zip(_parts(p_logits, nvec), _parts(q_logits, nvec)))


def multi_categorical_mode(logits: torch.Tensor, nvec: tuple) -> torch.Tensor:
    """The most probable action: each part's argmax. Returns int64 [..., K]."""
    return torch.stack([categorical_mode(part) for part in _parts(logits, nvec)], dim=-1)
