"""Return primitives: discounted, n-step and lambda returns, GAE, V-trace, Retrace, value rescaling.

Conventions:
- every sequence argument is time-major, `[T, ...]`, with any trailing batch dims, and all
  sequence arguments of one call share one shape;
- `discount_t` already includes `gamma * (1 - terminated_t)`;
- `done_t` (bool) is `terminated_t or truncated_t`: it cuts every trace, so nothing flows
  across an episode boundary; a truncated step bootstraps from `next_value_t`, the value of
  the final observation of its episode;
- `next_*` arguments are aligned to `t`: `next_value[t] = V(s_{t+1})`, the value of the
  observation that followed the action of step `t`;
- outputs are unreduced `[T, ...]` tensors; masking and reduction are the caller's.

Every recursive return is written once, as the reverse linear recurrence
`x_t = b_t + a_t * x_{t+1}`, solved by a log-depth scan (`reverse_linear_recurrence`), so the
compiled graph has O(log T) levels instead of T unrolled steps. Nothing branches on tensor
values, nothing writes in place: all functions compile with `torch.compile(fullgraph=True)`
and run under `torch.func.vmap` and `torch.func.grad`.
"""
from __future__ import annotations

import numbers

import torch

from fnrl.checks import check_bool, check_float, check_same_shape, check_shape, check_time

__all__ = [
    "reverse_linear_recurrence",
    "discounted_returns",
    "n_step_returns",
    "n_step_bootstrapped_returns",
    "lambda_returns",
    "gae",
    "vtrace",
    "retrace",
    "signed_hyperbolic",
    "signed_parabolic",
    "value_rescale",
    "value_rescale_inv",
]

Scalar = float | torch.Tensor


# --------------------------------------------------------------------------- checks


def _check_sequences(floats: dict[str, torch.Tensor], bools: dict[str, torch.Tensor] | None = None) -> None:
    """Float / bool dtypes, then rank >= 1 and a common T, then one common shape."""
    bools = bools or {}
    check_float(**floats)
    if bools:
        check_bool(**bools)
    every = {**floats, **bools}
    check_time(**every)
    check_same_shape(**every)


def _check_scalar(**scalars: Scalar) -> None:
    """Raise unless each value is a real Python number or a 0-d floating tensor.

    Private helper (fnrl/checks.py has no scalar check). Under `torch.func.vmap` a per-example
    hyperparameter (a `[K]` tensor vmapped over K) is seen here as 0-d, as it should be.
    """
    for name, x in scalars.items():
        if torch.is_tensor(x):
            if x.ndim != 0 or not x.is_floating_point():
                raise ValueError(
                    f"{name} must be a Python float or a 0-d floating tensor, "
                    f"got a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
                )
        elif isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise ValueError(f"{name} must be a Python float or a 0-d floating tensor, got {type(x).__name__}")


# --------------------------------------------------------------------------- time shifts


def _shift_up(x: torch.Tensor, k: int, fill: float | bool) -> torch.Tensor:
    """Row t of the result is x[t + k]; rows with t + k >= T hold `fill`. Shape of x."""
    return torch.cat([x[k:], torch.full_like(x[:k], fill)])


def _cut_at_end(done: torch.Tensor) -> torch.Tensor:
    """`done` with the last step also marked: every trace stops at t = T - 1 too."""
    return torch.cat([done[:-1], torch.ones_like(done[-1:])])


def _next_or_bootstrap(x: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """x_{t+1} where the episode goes on inside the sequence, else next_value_t. [T, ...]."""
    return torch.where(_cut_at_end(done), next_value, _shift_up(x, 1, 0.0))


# --------------------------------------------------------------------------- the kernel


def reverse_linear_recurrence(b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Solve x_t = b_t + a_t * x_{t+1} backwards in time, with x_T = 0 (so x_{T-1} = b_{T-1}).

    b, a: [T, ...], floating, same shape. Returns x: [T, ...].

    Log-depth (Hillis-Steele) scan: after the level with span s, each row holds the affine map
    x_t = offset_t + scale_t * x_{t+s}. Composing it with the map of row t+s,
    (scale_t, offset_t) o (scale_{t+s}, offset_{t+s}) = (scale_t * scale_{t+s},
    offset_t + scale_t * offset_{t+s}), doubles the span; rows past the end compose with the
    identity (scale 1, offset 0), which encodes x_T = 0. ceil(log2 T) levels of slicing, cat,
    multiply and add, so compile time hardly grows with T and no step divides (stable in
    float32 for thousands of steps: products of |a| <= 1 only shrink).
    """
    _check_sequences({"b": b, "a": a})
    num_steps = b.shape[0]
    offset, scale = b, a
    span = 1
    while span < num_steps:
        offset = offset + scale * _shift_up(offset, span, 0.0)
        if 2 * span < num_steps:  # the last level never reads scale again
            scale = scale * _shift_up(scale, span, 1.0)
        span *= 2
    return offset


# --------------------------------------------------------------------------- returns


def discounted_returns(reward: torch.Tensor, discount: torch.Tensor, bootstrap: torch.Tensor) -> torch.Tensor:
    """Discounted returns G_t = r_t + discount_t * G_{t+1}, with G_T = bootstrap.

    reward, discount: [T, ...]; bootstrap: [...] = reward.shape[1:], the value of the
    observation after the last step (multiplied by discount_{T-1}, so it is ignored after a
    termination). No trace cutting: use `lambda_returns(..., lam=1)` when the sequence holds
    truncations. Returns G: [T, ...].
    """
    _check_sequences({"reward": reward, "discount": discount})
    check_float(bootstrap=bootstrap)
    check_shape("bootstrap", bootstrap, reward.shape[1:], "[...] = reward.shape[1:]")
    last = reward[-1:] + discount[-1:] * bootstrap.unsqueeze(0)
    return reverse_linear_recurrence(torch.cat([reward[:-1], last]), discount)


def _n_step_windows(
    reward: torch.Tensor,
    discount: torch.Tensor,
    done: torch.Tensor,
    n: int,
    next_value: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Walk the n-step windows of all steps at once (k = 0..n-1; no loop over T).

    Returns (returns, bootstrap_discount, length m, next_value at row t + m - 1 or None).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a Python int >= 1, got {n!r}")
    cut = _cut_at_end(done)
    in_window = torch.ones_like(done)  # is step t + k inside the window of step t?
    returns = torch.zeros_like(reward)
    discount_so_far = torch.ones_like(discount)  # prod_{j<k} discount_{t+j}
    length = torch.zeros_like(done, dtype=torch.int64)
    last_next_value = None if next_value is None else torch.zeros_like(next_value)
    for k in range(min(n, reward.shape[0])):
        if k > 0:
            in_window = in_window & ~_shift_up(cut, k - 1, True)
        returns = returns + torch.where(in_window, discount_so_far * _shift_up(reward, k, 0.0), 0.0)
        discount_so_far = torch.where(in_window, discount_so_far * _shift_up(discount, k, 1.0), discount_so_far)
        length = length + in_window.long()
        if next_value is not None:
            last_next_value = torch.where(in_window, _shift_up(next_value, k, 0.0), last_next_value)
    return returns, discount_so_far, length, last_next_value


def n_step_returns(
    reward: torch.Tensor, discount: torch.Tensor, done: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns, their bootstrap discounts and bootstrap offsets (Sutton & Barto 2018, 7.1).

    Step t uses the window t .. t+m-1 with m = min(n, steps up to and including the first
    done at or after t, T - t):

        returns_t            = sum_{k<m} (prod_{j<k} discount_{t+j}) r_{t+k}
        bootstrap_discount_t = prod_{j<m} discount_{t+j}   (0 if the episode terminated in the
                                                            window; gamma^m after a truncation)
        bootstrap_offset_t   = m                            (int64)

    so the n-step target is returns_t + bootstrap_discount_t * V(obs[t + m]), where
    obs[t + m] is the next observation of step t + m - 1 (see `n_step_bootstrapped_returns`).

    reward, discount: [T, ...] float; done: [T, ...] bool (terminated or truncated);
    n: Python int >= 1. Exact for every row, so windows gathered as [n, N] give the
    n-step return of their first step in row 0. Returns three [T, ...] tensors.
    """
    _check_sequences({"reward": reward, "discount": discount}, {"done": done})
    returns, bootstrap_discount, bootstrap_offset, _ = _n_step_windows(reward, discount, done, n, None)
    return returns, bootstrap_discount, bootstrap_offset


def n_step_bootstrapped_returns(
    reward: torch.Tensor, discount: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor, n: int
) -> torch.Tensor:
    """n-step targets: returns_t + bootstrap_discount_t * next_value[t + m - 1].

    Windows and m as in `n_step_returns`; next_value[t] = V(s_{t+1}) (at a truncated step,
    the value of the final observation). reward, discount, next_value: [T, ...] float;
    done: [T, ...] bool; n: Python int >= 1. Returns targets [T, ...].
    n = 1 gives the one-step TD target r_t + discount_t * next_value_t; n >= T gives
    `lambda_returns(..., lam=1)`.
    """
    _check_sequences({"reward": reward, "discount": discount, "next_value": next_value}, {"done": done})
    returns, bootstrap_discount, _, bootstrap_value = _n_step_windows(reward, discount, done, n, next_value)
    return returns + bootstrap_discount * bootstrap_value


def lambda_returns(
    reward: torch.Tensor, next_value: torch.Tensor, discount: torch.Tensor, done: torch.Tensor, lam: Scalar
) -> torch.Tensor:
    """TD(lambda) returns (Sutton & Barto 2018, 12.1; rlax.lambda_returns), traces cut at `done`.

    G_t = r_t + discount_t * ((1 - lam) V_{t+1} + lam (1 - done_t) G_{t+1} + lam done_t V_{t+1}),
    with V_{t+1} = next_value_t and, at t = T - 1, G_{t+1} replaced by next_value_{T-1}.
    As a recurrence: G_t = r_t + (discount_t - a_t) V_{t+1} + a_t G_{t+1},
    a_t = discount_t * lam * (1 - done_t) (and a_{T-1} = 0).

    reward, next_value, discount: [T, ...] float; done: [T, ...] bool; lam: float or 0-d
    tensor. lam = 1 gives Monte Carlo returns bootstrapped at truncations and at the end;
    lam = 0 gives one-step TD targets. Returns G: [T, ...].
    """
    _check_sequences({"reward": reward, "next_value": next_value, "discount": discount}, {"done": done})
    _check_scalar(lam=lam)
    trace = discount * lam * (~_cut_at_end(done))
    return reverse_linear_recurrence(reward + (discount - trace) * next_value, trace)


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    discount: torch.Tensor,
    done: torch.Tensor,
    lam: Scalar,
) -> torch.Tensor:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    A_t = d_t + discount_t * lam * (1 - done_t) * A_{t+1},  A_T = 0,
    d_t = r_t + discount_t * next_value_t - value_t.

    reward, value, next_value, discount: [T, ...] float; done: [T, ...] bool (cuts the trace
    at truncation too); lam: float or 0-d tensor. When next_value_t = value_{t+1} inside
    episodes, gae(...) + value == lambda_returns(...). Returns advantages [T, ...].
    """
    _check_sequences(
        {"reward": reward, "value": value, "next_value": next_value, "discount": discount}, {"done": done}
    )
    _check_scalar(lam=lam)
    delta = reward + discount * next_value - value
    return reverse_linear_recurrence(delta, discount * lam * (~done))


def vtrace(
    log_rho: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    discount: torch.Tensor,
    done: torch.Tensor,
    lam: Scalar = 1.0,
    rho_clip: float = 1.0,
    c_clip: float = 1.0,
    pg_rho_clip: float = 1.0,
    *,
    stop_target_gradients: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA, arXiv:1802.01561).

    rho_t = min(rho_clip, exp(log_rho_t)),  c_t = lam * min(c_clip, exp(log_rho_t)),
    delta_t = r_t + discount_t * next_value_t - value_t,
    vs_t - value_t = rho_t delta_t + discount_t c_t (1 - done_t) (vs_{t+1} - value_{t+1}),
    pg_advantage_t = min(pg_rho_clip, exp(log_rho_t)) * (r_t + discount_t vs'_{t+1} - value_t),
    vs'_{t+1} = vs_{t+1}, or next_value_t where done_t and at t = T - 1.

    log_rho: [T, ...] log pi(a_t|s_t) - log mu(a_t|s_t); reward, value, next_value, discount:
    [T, ...] float; done: [T, ...] bool; lam: float or 0-d tensor.
    As in rlax, both outputs are detached unless `stop_target_gradients=False`: use vs as the
    value target and pg_advantage as the weight of -log pi. Returns (vs, pg_advantage), [T, ...].
    On-policy (log_rho = 0, clips >= 1), vs == lambda_returns(lam) and, for lam = 1,
    pg_advantage == gae(lam=1).
    """
    _check_sequences(
        {"log_rho": log_rho, "reward": reward, "value": value, "next_value": next_value, "discount": discount},
        {"done": done},
    )
    _check_scalar(lam=lam, rho_clip=rho_clip, c_clip=c_clip, pg_rho_clip=pg_rho_clip)
    rho = torch.exp(log_rho)
    delta = reward + discount * next_value - value
    trace = discount * lam * torch.clamp(rho, max=c_clip) * (~done)
    vs = value + reverse_linear_recurrence(torch.clamp(rho, max=rho_clip) * delta, trace)
    next_vs = _next_or_bootstrap(vs, next_value, done)
    pg_advantage = torch.clamp(rho, max=pg_rho_clip) * (reward + discount * next_vs - value)
    if stop_target_gradients:
        return vs.detach(), pg_advantage.detach()
    return vs, pg_advantage


def retrace(
    q_taken: torch.Tensor,
    expected_next_q: torch.Tensor,
    next_q_taken: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    done: torch.Tensor,
    log_rho_next: torch.Tensor,
    lam: Scalar = 1.0,
    *,
    stop_target_gradients: bool = True,
) -> torch.Tensor:
    """Retrace(lambda) targets (Munos et al. 2016, arXiv:1606.02647; rlax.retrace).

    target_t = r_t + discount_t * (E_pi Q(s_{t+1}, .) - c_{t+1} Q(s_{t+1}, a_{t+1}))
                   + discount_t * c_{t+1} * target_{t+1},
    c_{t+1} = lam * min(1, pi(a_{t+1}|s_{t+1}) / mu(a_{t+1}|s_{t+1})), set to 0 where done_t and
    at t = T - 1 (there target_t = r_t + discount_t * E_pi Q(s_{t+1}, .)).

    All arguments [T, ...]; the next_* ones hold quantities of step t+1 at index t:
      q_taken[t]         = Q(s_t, a_t) (only checked for shape: the TD error is
                           target - q_taken, left to the caller),
      expected_next_q[t] = sum_a pi(a|s_{t+1}) Q(s_{t+1}, a) (at a truncation: of the final obs),
      next_q_taken[t]    = Q(s_{t+1}, a_{t+1}) (unused where done_t or t = T - 1),
      log_rho_next[t]    = log pi(a_{t+1}|s_{t+1}) - log mu(a_{t+1}|s_{t+1}),
      reward, discount, done: of step t (done bool).
    Q values are usually from the target network. Returns targets [T, ...], detached
    unless `stop_target_gradients=False`.
    """
    _check_sequences(
        {
            "q_taken": q_taken,
            "expected_next_q": expected_next_q,
            "next_q_taken": next_q_taken,
            "reward": reward,
            "discount": discount,
            "log_rho_next": log_rho_next,
        },
        {"done": done},
    )
    _check_scalar(lam=lam)
    trace = discount * lam * torch.clamp(torch.exp(log_rho_next), max=1.0) * (~_cut_at_end(done))
    target = reverse_linear_recurrence(reward + discount * expected_next_q - trace * next_q_taken, trace)
    return target.detach() if stop_target_gradients else target


# --------------------------------------------------------------------------- value rescaling


def signed_hyperbolic(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Value rescaling h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018; R2D2).

    Computed as x / (sqrt(|x| + 1) + 1) + eps x (same value, no cancellation near 0, smooth
    at 0). x: any shape, float. Returns h(x), shape of x.
    """
    check_float(x=x)
    _check_scalar(eps=eps)
    return x / (torch.sqrt(torch.abs(x) + 1.0) + 1.0) + eps * x


def signed_parabolic(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """Exact inverse of `signed_hyperbolic` (Pohlen et al. 2018, arXiv:1805.11593; R2D2).

    h^-1(x) = sign(x) * (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1).

    Evaluated without cancellation: with s0 = 1 + 2 eps and s = sqrt(s0^2 + 4 eps |x|)
    (note 1 + 4 eps (1 + eps) = s0^2), z = (sqrt(...) - 1) / (2 eps) satisfies
    z - 1 = |x| w, w = (2 - 4 eps / (s0 + s)) / (s + 1), so h^-1(x) = x w (|x| w + 2).
    x: any shape, float. Returns h^-1(x), shape of x.
    """
    check_float(x=x)
    _check_scalar(eps=eps)
    magnitude = torch.abs(x)
    s0 = 1.0 + 2.0 * eps
    s = torch.sqrt(s0 * s0 + 4.0 * eps * magnitude)
    w = (2.0 - 4.0 * eps / (s0 + s)) / (s + 1.0)
    return x * w * (magnitude * w + 2.0)


value_rescale = signed_hyperbolic
value_rescale_inv = signed_parabolic
