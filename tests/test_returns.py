"""Tests for fnrl/returns.py: hand-worked examples, plain-loop references, identities,
compile / vmap / grad behaviour and argument errors."""
import math

import pytest
import torch

from fnrl.returns import (
    discounted_returns,
    gae,
    lambda_returns,
    n_step_bootstrapped_returns,
    n_step_returns,
    retrace,
    reverse_linear_recurrence,
    signed_hyperbolic,
    signed_parabolic,
    value_rescale,
    value_rescale_inv,
    vtrace,
)

F64 = torch.float64


def t64(*values):
    return torch.tensor(values, dtype=F64)


def flags(*values):
    return torch.tensor(values, dtype=torch.bool)


# --------------------------------------------------------------------------- random episodes


def episodes(T=9, B=4, gamma=0.9, seed=0, dtype=F64, truncations=True):
    """Random rollout [T, B] with terminations and (optionally) truncations mid-sequence.

    next_value[t] = value[t + 1] inside an episode; at a done step it is the value of the
    final observation (random here; multiplied by discount 0 after a termination).
    """
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.rand(T, B, generator=g, dtype=dtype)  # noqa: E731
    terminated = rand() < 0.15
    truncated = (rand() < 0.15) & ~terminated if truncations else torch.zeros(T, B, dtype=torch.bool)
    terminated[2, 0] = True
    if truncations:
        terminated[4, 1] = False
        truncated[4, 1] = True
    done = terminated | truncated
    value = torch.randn(T, B, generator=g, dtype=dtype)
    final_value = torch.randn(T, B, generator=g, dtype=dtype)
    following_value = torch.cat([value[1:], final_value[-1:]])
    next_value = torch.where(done, final_value, following_value)
    return dict(
        reward=torch.randn(T, B, generator=g, dtype=dtype),
        value=value,
        next_value=next_value,
        discount=gamma * (~terminated).to(dtype),
        done=done,
        log_rho=0.5 * torch.randn(T, B, generator=g, dtype=dtype),
    )


def retrace_inputs(T=9, B=4, seed=1):
    """Episodes plus Q values; next_q_taken[t] = q_taken[t + 1] inside an episode."""
    ep = episodes(T, B, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    q_taken = torch.randn(T, B, generator=g, dtype=F64)
    other_q = torch.randn(T, B, generator=g, dtype=F64)
    following_q = torch.cat([q_taken[1:], other_q[-1:]])
    next_q_taken = torch.where(ep["done"], other_q, following_q)
    expected_next_q = torch.randn(T, B, generator=g, dtype=F64)
    return dict(ep, q_taken=q_taken, next_q_taken=next_q_taken, expected_next_q=expected_next_q)


# --------------------------------------------------------------------------- plain-loop references


def ref_recurrence(b, a):
    x, out = torch.zeros_like(b[0]), []
    for t in reversed(range(b.shape[0])):
        x = b[t] + a[t] * x
        out.append(x)
    return torch.stack(out[::-1])


def ref_discounted(reward, discount, bootstrap):
    g, out = bootstrap, []
    for t in reversed(range(reward.shape[0])):
        g = reward[t] + discount[t] * g
        out.append(g)
    return torch.stack(out[::-1])


def ref_n_step(reward, discount, done, next_value, n):
    """Scalar loops per column: (returns, bootstrap_discount, offset, bootstrapped target)."""
    T = reward.shape[0]
    r, d, e, v = (x.reshape(T, -1) for x in (reward, discount, done, next_value))
    ret, disc, off, target = (torch.zeros_like(r) for _ in range(4))
    for j in range(r.shape[1]):
        for t in range(T):
            total, prod, m = 0.0, 1.0, 0
            for k in range(n):
                if t + k >= T:
                    break
                total += prod * r[t + k, j].item()
                prod *= d[t + k, j].item()
                m += 1
                if e[t + k, j]:
                    break
            ret[t, j], disc[t, j], off[t, j] = total, prod, m
            target[t, j] = total + prod * v[t + m - 1, j].item()
    shape = reward.shape
    return ret.reshape(shape), disc.reshape(shape), off.long().reshape(shape), target.reshape(shape)


def ref_lambda(reward, next_value, discount, done, lam):
    T, out, g = reward.shape[0], [], None
    for t in reversed(range(T)):
        following = next_value[t] if t == T - 1 else torch.where(done[t], next_value[t], g)
        g = reward[t] + discount[t] * ((1 - lam) * next_value[t] + lam * following)
        out.append(g)
    return torch.stack(out[::-1])


def ref_gae(reward, value, next_value, discount, done, lam):
    adv, out = torch.zeros_like(reward[0]), []
    for t in reversed(range(reward.shape[0])):
        delta = reward[t] + discount[t] * next_value[t] - value[t]
        adv = delta + discount[t] * lam * (~done[t]) * adv
        out.append(adv)
    return torch.stack(out[::-1])


def ref_vtrace(log_rho, reward, value, next_value, discount, done, lam=1.0, rho_clip=1.0, c_clip=1.0, pg_clip=1.0):
    """Espeholt et al. (2018) eq. (1) as an explicit sum, then the pg advantage."""
    T = reward.shape[0]
    ratio = torch.exp(log_rho)
    rho, c = ratio.clamp(max=rho_clip), lam * ratio.clamp(max=c_clip)
    delta = rho * (reward + discount * next_value - value)
    vs = []
    for t in range(T):
        total, coef, alive = torch.zeros_like(value[t]), torch.ones_like(value[t]), torch.ones_like(done[t])
        for s in range(t, T):
            total = total + alive * coef * delta[s]
            coef = coef * discount[s] * c[s]
            alive = alive & ~done[s]
        vs.append(value[t] + total)
    vs = torch.stack(vs)
    pg = []
    for t in range(T):
        following = next_value[t] if t == T - 1 else torch.where(done[t], next_value[t], vs[t + 1])
        pg.append(ratio[t].clamp(max=pg_clip) * (reward[t] + discount[t] * following - value[t]))
    return vs, torch.stack(pg)


def ref_retrace_operator(q_taken, expected_next_q, reward, discount, done, log_rho_next, lam):
    """Munos et al. (2016): target_t = Q_t + sum_s (prod_{i=t}^{s-1} discount_i c_{i+1}) delta_s,
    delta_s = r_s + discount_s E_pi Q(s_{s+1}) - Q_s; sums stop at the first done."""
    T = reward.shape[0]
    c_next = lam * torch.exp(log_rho_next).clamp(max=1.0)
    delta = reward + discount * expected_next_q - q_taken
    targets = []
    for t in range(T):
        total, coef, alive = torch.zeros_like(q_taken[t]), torch.ones_like(q_taken[t]), torch.ones_like(done[t])
        for s in range(t, T):
            total = total + alive * coef * delta[s]
            coef = coef * discount[s] * c_next[s]
            alive = alive & ~done[s]
        targets.append(q_taken[t] + total)
    return torch.stack(targets)


# --------------------------------------------------------------------------- hand-computed examples


def test_reverse_linear_recurrence_by_hand():
    b = t64(1, 2, 3, 4)
    # x3 = 4, x2 = 3 + 0.5*4 = 5, x1 = 2 + 0.5*5 = 4.5, x0 = 1 + 0.5*4.5 = 3.25
    torch.testing.assert_close(reverse_linear_recurrence(b, t64(0.5, 0.5, 0.5, 0.5)), t64(3.25, 4.5, 5, 4))
    # a1 = 0 cuts: x1 = 2, x0 = 1 + 0.5*2 = 2
    torch.testing.assert_close(reverse_linear_recurrence(b, t64(0.5, 0, 0.5, 0.5)), t64(2, 2, 5, 4))
    # T = 5 (not a power of two): 1 + 0.5 x_{t+1}
    ones = torch.ones(5, dtype=F64)
    torch.testing.assert_close(reverse_linear_recurrence(ones, 0.5 * ones), t64(1.9375, 1.875, 1.75, 1.5, 1))
    torch.testing.assert_close(reverse_linear_recurrence(t64(7), t64(0.5)), t64(7))


def test_discounted_returns_by_hand():
    r, d = t64(1, 0, 2), t64(0.5, 0.5, 0.5)
    # G2 = 2 + 0.5*8 = 6, G1 = 0 + 0.5*6 = 3, G0 = 1 + 0.5*3 = 2.5
    torch.testing.assert_close(discounted_returns(r, d, torch.tensor(8.0, dtype=F64)), t64(2.5, 3, 6))
    # terminated at t=1: G1 = 0, G0 = 1
    torch.testing.assert_close(discounted_returns(r, t64(0.5, 0, 0.5), torch.tensor(8.0, dtype=F64)), t64(1, 0, 6))


def test_n_step_returns_by_hand():
    r, half = t64(1, 2, 3, 4), t64(0.5, 0.5, 0.5, 0.5)
    no_done = flags(False, False, False, False)
    ret, disc, off = n_step_returns(r, half, no_done, 2)
    torch.testing.assert_close(ret, t64(2, 3.5, 5, 4))  # 1+0.5*2, 2+0.5*3, 3+0.5*4, 4
    torch.testing.assert_close(disc, t64(0.25, 0.25, 0.25, 0.5))
    assert off.dtype == torch.int64 and off.tolist() == [2, 2, 2, 1]

    # terminated at t=1 (discount 0), n=3: windows [0,1], [1], [2,3], [3]
    ret, disc, off = n_step_returns(r, t64(0.5, 0, 0.5, 0.5), flags(False, True, False, False), 3)
    torch.testing.assert_close(ret, t64(2, 2, 5, 4))
    torch.testing.assert_close(disc, t64(0, 0, 0.25, 0.5))
    assert off.tolist() == [2, 1, 2, 1]

    # truncated at t=1 (done, discount stays 0.5): same windows, bootstrap gamma^m
    truncated = flags(False, True, False, False)
    ret, disc, off = n_step_returns(r, half, truncated, 3)
    torch.testing.assert_close(ret, t64(2, 2, 5, 4))
    torch.testing.assert_close(disc, t64(0.25, 0.5, 0.25, 0.5))
    assert off.tolist() == [2, 1, 2, 1]
    # targets: 2 + 0.25*V[1], 2 + 0.5*V[1], 5 + 0.25*V[3], 4 + 0.5*V[3]
    target = n_step_bootstrapped_returns(r, half, t64(10, 20, 30, 40), truncated, 3)
    torch.testing.assert_close(target, t64(7, 12, 15, 24))


def test_lambda_returns_by_hand():
    r, nv, d = t64(1, 2, 3), t64(4, 8, 16), t64(0.5, 0.5, 0.5)
    # G2 = 3 + 0.5*16 = 11; G1 = 2 + 0.5*(0.5*8 + 0.5*11) = 6.75; G0 = 1 + 0.5*(0.5*4 + 0.5*6.75) = 3.6875
    torch.testing.assert_close(lambda_returns(r, nv, d, flags(False, False, False), 0.5), t64(3.6875, 6.75, 11))
    # done (truncated) at t=1: G1 = 2 + 0.5*8 = 6; G0 = 1 + 0.5*(0.5*4 + 0.5*6) = 3.5
    torch.testing.assert_close(lambda_returns(r, nv, d, flags(False, True, False), 0.5), t64(3.5, 6, 11))
    lam = torch.tensor(0.5, dtype=F64)
    torch.testing.assert_close(lambda_returns(r, nv, d, flags(False, True, False), lam), t64(3.5, 6, 11))


def test_gae_by_hand():
    r, v, nv, d = t64(1, 2, 3), t64(2, 4, 8), t64(4, 8, 16), t64(0.5, 0.5, 0.5)
    # delta = r + 0.5*nv - v = [1, 2, 3]; A2 = 3, A1 = 2 + 0.25*3 = 2.75, A0 = 1 + 0.25*2.75 = 1.6875
    torch.testing.assert_close(gae(r, v, nv, d, flags(False, False, False), 0.5), t64(1.6875, 2.75, 3))
    # done at t=0 cuts: A0 = delta0 = 1
    torch.testing.assert_close(gae(r, v, nv, d, flags(True, False, False), 0.5), t64(1, 2.75, 3))


def test_vtrace_by_hand():
    log_rho = torch.log(t64(2, 0.5))  # rho = c = [1, 0.5] after clipping at 1
    r, v, nv, d = t64(1, 2), t64(2, 4), t64(4, 8), t64(0.5, 0.5)
    # delta = [1 + 2 - 2, 2 + 4 - 4] = [1, 2]; vs1 = 4 + 0.5*2 = 5; vs0 = 2 + 1 + 0.5*1*(5 - 4) = 3.5
    # pg0 = 1 * (1 + 0.5*5 - 2) = 1.5; pg1 = 0.5 * (2 + 0.5*8 - 4) = 1
    vs, pg = vtrace(log_rho, r, v, nv, d, flags(False, False))
    torch.testing.assert_close(vs, t64(3.5, 5))
    torch.testing.assert_close(pg, t64(1.5, 1))
    # done at t=0: vs0 = 2 + 1 = 3, pg0 = 1 + 0.5*4 - 2 = 1 (bootstraps from next_value)
    vs, pg = vtrace(log_rho, r, v, nv, d, flags(True, False))
    torch.testing.assert_close(vs, t64(3, 5))
    torch.testing.assert_close(pg, t64(1, 1))


def test_retrace_by_hand():
    r, d = t64(1, 2), t64(0.5, 0.5)
    expected_next_q, next_q_taken = t64(4, 8), t64(6, 10)
    log_rho_next = torch.log(t64(0.5, 1))
    q_taken = t64(0, 0)  # only its shape matters
    # target1 = 2 + 0.5*8 = 6; c1 = 0.5: target0 = 1 + 0.5*(4 - 0.5*6) + 0.5*0.5*6 = 3
    target = retrace(q_taken, expected_next_q, next_q_taken, r, d, flags(False, False), log_rho_next)
    torch.testing.assert_close(target, t64(3, 6))
    # next_q_taken0 = 2: target0 = 1 + 0.5*(4 - 0.5*2) + 0.5*0.5*6 = 4
    target = retrace(q_taken, expected_next_q, t64(2, 10), r, d, flags(False, False), log_rho_next)
    torch.testing.assert_close(target, t64(4, 6))
    # done at t=0, or lam = 0: target0 = 1 + 0.5*4 = 3 (expected SARSA)
    target = retrace(q_taken, expected_next_q, t64(2, 10), r, d, flags(True, False), log_rho_next)
    torch.testing.assert_close(target, t64(3, 6))
    target = retrace(q_taken, expected_next_q, t64(2, 10), r, d, flags(False, False), log_rho_next, lam=0.0)
    torch.testing.assert_close(target, t64(3, 6))


def test_value_rescale_by_hand():
    x = t64(3, -8, 0)
    # h(3) = sqrt(4) - 1 + 0.003; h(-8) = -(sqrt(9) - 1) - 0.008
    torch.testing.assert_close(signed_hyperbolic(x), t64(1.003, -2.008, 0))
    torch.testing.assert_close(signed_parabolic(t64(1.003, -2.008, 0)), x)
    torch.testing.assert_close(signed_hyperbolic(t64(3), eps=0.0), t64(1.0))
    assert value_rescale is signed_hyperbolic and value_rescale_inv is signed_parabolic


# --------------------------------------------------------------------------- loop references


@pytest.mark.parametrize("T", [1, 2, 3, 5, 8, 13, 33])
def test_reverse_linear_recurrence_matches_loop(T):
    g = torch.Generator().manual_seed(T)
    b = torch.randn(T, 3, 2, generator=g, dtype=F64)
    a = torch.rand(T, 3, 2, generator=g, dtype=F64) * (torch.rand(T, 3, 2, generator=g, dtype=F64) > 0.2)
    torch.testing.assert_close(reverse_linear_recurrence(b, a), ref_recurrence(b, a))


def test_reverse_linear_recurrence_float32_long_sequence():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(3000, 2, generator=g, dtype=F64)
    a = 0.99 + 0.01 * torch.rand(3000, 2, generator=g, dtype=F64)
    expected = ref_recurrence(b, a)
    got = reverse_linear_recurrence(b.float(), a.float())
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-3)


def test_discounted_returns_matches_loop():
    ep = episodes()
    bootstrap = ep["next_value"][-1]
    got = discounted_returns(ep["reward"], ep["discount"], bootstrap)
    torch.testing.assert_close(got, ref_discounted(ep["reward"], ep["discount"], bootstrap))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20])
def test_n_step_matches_loop(n):
    ep = episodes(T=8, B=5, seed=n)
    ret, disc, off, target = ref_n_step(ep["reward"], ep["discount"], ep["done"], ep["next_value"], n)
    got = n_step_returns(ep["reward"], ep["discount"], ep["done"], n)
    torch.testing.assert_close(got[0], ret)
    torch.testing.assert_close(got[1], disc)
    torch.testing.assert_close(got[2], off)
    got_target = n_step_bootstrapped_returns(ep["reward"], ep["discount"], ep["next_value"], ep["done"], n)
    torch.testing.assert_close(got_target, target)


def test_n_step_on_gathered_windows_row_zero():
    """Replay gathers [n, N] windows, one per (start step, env); row 0 is the start's n-step return."""
    ep, n = episodes(T=10, B=2, seed=3), 4
    r, d, done, nv = (ep[k] for k in ("reward", "discount", "done", "next_value"))
    starts = [(t, j) for t in range(10 - n + 1) for j in range(2)]
    gather = lambda x: torch.stack([x[t : t + n, j] for t, j in starts], dim=1)  # noqa: E731
    expected = [x[[t for t, _ in starts], [j for _, j in starts]] for x in n_step_returns(r, d, done, n)]
    for got, want in zip(n_step_returns(gather(r), gather(d), gather(done), n), expected):
        torch.testing.assert_close(got[0], want)
    full_target = n_step_bootstrapped_returns(r, d, nv, done, n)
    window_target = n_step_bootstrapped_returns(gather(r), gather(d), gather(nv), gather(done), n)
    torch.testing.assert_close(window_target[0], full_target[[t for t, _ in starts], [j for _, j in starts]])


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_lambda_returns_matches_loop(lam):
    ep = episodes()
    got = lambda_returns(ep["reward"], ep["next_value"], ep["discount"], ep["done"], lam)
    torch.testing.assert_close(got, ref_lambda(ep["reward"], ep["next_value"], ep["discount"], ep["done"], lam))


@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_loop(lam):
    ep = episodes()
    args = (ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"], lam)
    torch.testing.assert_close(gae(*args), ref_gae(*args))


@pytest.mark.parametrize(
    "lam, rho_clip, c_clip, pg_clip", [(1.0, 1.0, 1.0, 1.0), (0.9, 2.0, 1.0, 1.5), (1.0, math.inf, math.inf, math.inf)]
)
def test_vtrace_matches_loop(lam, rho_clip, c_clip, pg_clip):
    ep = episodes(seed=7)
    args = (ep["log_rho"], ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"])
    vs, pg = vtrace(*args, lam, rho_clip, c_clip, pg_clip)
    ref_vs, ref_pg = ref_vtrace(*args, lam, rho_clip, c_clip, pg_clip)
    torch.testing.assert_close(vs, ref_vs)
    torch.testing.assert_close(pg, ref_pg)


@pytest.mark.parametrize("lam", [0.0, 0.7, 1.0])
def test_retrace_matches_operator_form(lam):
    x = retrace_inputs()
    got = retrace(
        x["q_taken"], x["expected_next_q"], x["next_q_taken"], x["reward"], x["discount"], x["done"], x["log_rho"], lam
    )
    expected = ref_retrace_operator(
        x["q_taken"], x["expected_next_q"], x["reward"], x["discount"], x["done"], x["log_rho"], lam
    )
    torch.testing.assert_close(got, expected)


# --------------------------------------------------------------------------- identities


def test_gae_lambda_one_is_discounted_return_minus_value_without_truncation():
    ep = episodes(truncations=False)
    adv = gae(ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"], 1.0)
    returns = discounted_returns(ep["reward"], ep["discount"], ep["next_value"][-1])
    torch.testing.assert_close(adv, returns - ep["value"])
    lam_one = lambda_returns(ep["reward"], ep["next_value"], ep["discount"], ep["done"], 1.0)
    torch.testing.assert_close(lam_one, returns)


@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
def test_gae_plus_value_is_lambda_return(lam):
    ep = episodes(seed=5)
    adv = gae(ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"], lam)
    returns = lambda_returns(ep["reward"], ep["next_value"], ep["discount"], ep["done"], lam)
    torch.testing.assert_close(adv + ep["value"], returns)


@pytest.mark.parametrize("lam", [0.6, 1.0])
def test_vtrace_on_policy_is_lambda_return(lam):
    ep = episodes(seed=11)
    on_policy = torch.zeros_like(ep["log_rho"])
    vs, pg = vtrace(on_policy, ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"], lam)
    torch.testing.assert_close(vs, lambda_returns(ep["reward"], ep["next_value"], ep["discount"], ep["done"], lam))
    if lam == 1.0:
        adv = gae(ep["reward"], ep["value"], ep["next_value"], ep["discount"], ep["done"], 1.0)
        torch.testing.assert_close(pg, adv)


def test_retrace_without_traces_is_expected_sarsa():
    x = retrace_inputs(seed=4)
    never = torch.full_like(x["log_rho"], -1e4)  # pi(a_{t+1}) ~ 0: c = 0
    target = retrace(
        x["q_taken"], x["expected_next_q"], x["next_q_taken"], x["reward"], x["discount"], x["done"], never
    )
    torch.testing.assert_close(target, x["reward"] + x["discount"] * x["expected_next_q"])


def test_n_step_one_is_reward_and_discount():
    ep = episodes()
    ret, disc, off = n_step_returns(ep["reward"], ep["discount"], ep["done"], 1)
    torch.testing.assert_close(ret, ep["reward"])
    torch.testing.assert_close(disc, ep["discount"])
    assert (off == 1).all()
    target = n_step_bootstrapped_returns(ep["reward"], ep["discount"], ep["next_value"], ep["done"], 1)
    torch.testing.assert_close(target, lambda_returns(ep["reward"], ep["next_value"], ep["discount"], ep["done"], 0.0))


@pytest.mark.parametrize("n", [9, 12])
def test_n_step_beyond_T_is_full_return(n):
    ep = episodes(T=9)
    r, d = ep["reward"], ep["discount"]
    no_done = torch.zeros_like(ep["done"])
    bootstrap = ep["next_value"][-1]
    ret, disc, off = n_step_returns(r, 0.9 * torch.ones_like(d), no_done, n)
    torch.testing.assert_close(ret + disc * bootstrap, discounted_returns(r, 0.9 * torch.ones_like(d), bootstrap))
    assert off[:, 0].tolist() == list(range(9, 0, -1))
    # with terminations and truncations, the bootstrapped n-step target is the lambda=1 return
    target = n_step_bootstrapped_returns(r, d, ep["next_value"], ep["done"], n)
    torch.testing.assert_close(target, lambda_returns(r, ep["next_value"], d, ep["done"], 1.0))


def test_signed_parabolic_inverts_signed_hyperbolic():
    magnitudes = torch.logspace(-4, 6, 201, dtype=F64)
    x = torch.cat([-magnitudes.flip(0), torch.zeros(1, dtype=F64), magnitudes])
    torch.testing.assert_close(signed_parabolic(signed_hyperbolic(x)), x, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(signed_hyperbolic(signed_parabolic(x)), x, rtol=1e-12, atol=0.0)
    for eps in (1e-2, 1e-1):
        torch.testing.assert_close(signed_parabolic(signed_hyperbolic(x, eps), eps), x, rtol=1e-12, atol=0.0)


def test_signed_parabolic_is_the_paper_formula():
    x = torch.linspace(-50, 50, 101, dtype=F64)
    eps = 1e-3
    paper = torch.sign(x) * (((torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)
    torch.testing.assert_close(signed_parabolic(x, eps), paper, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- torch.compile


@pytest.fixture(scope="module")
def compiled():
    """Each function compiled once for the module (fullgraph: no graph breaks allowed)."""
    torch._dynamo.reset()
    return {
        "recurrence": torch.compile(reverse_linear_recurrence, fullgraph=True),
        "gae": torch.compile(gae, fullgraph=True),
        "vtrace": torch.compile(vtrace, fullgraph=True),
        "n_step": torch.compile(n_step_returns, fullgraph=True),
    }


def _compile_cases(seed):
    ep = {k: v.float() if v.is_floating_point() else v for k, v in episodes(T=13, B=3, seed=seed).items()}
    r, v, nv, d, done, lr = (ep[k] for k in ("reward", "value", "next_value", "discount", "done", "log_rho"))
    return {
        "recurrence": (lambda f: f(r, d * 0.9), reverse_linear_recurrence),
        "gae": (lambda f: f(r, v, nv, d, done, 0.95), gae),
        "vtrace": (lambda f: f(lr, r, v, nv, d, done, 0.9), vtrace),
        "n_step": (lambda f: f(r, d, done, 3), n_step_returns),
    }


@pytest.mark.parametrize("name", ["recurrence", "gae", "vtrace", "n_step"])
def test_compiled_equals_eager_without_recompiling(compiled, name):
    for seed in (0, 1):  # second call: new values, same shapes -> must reuse the graph
        call, eager = _compile_cases(seed)[name]
        with torch._dynamo.config.patch(error_on_recompile=seed == 1):
            got = call(compiled[name])
        torch.testing.assert_close(got, call(eager))


# --------------------------------------------------------------------------- vmap


def _stacked(K=3, **kwargs):
    eps = [episodes(seed=s, **kwargs) for s in range(K)]
    return {k: torch.stack([e[k] for e in eps]) for k in eps[0]}


VMAP_CASES = {
    "recurrence": (lambda e: (e["reward"], e["discount"]), reverse_linear_recurrence),
    "discounted": (lambda e: (e["reward"], e["discount"], e["next_value"][..., -1, :]), discounted_returns),
    "n_step": (lambda e: (e["reward"], e["discount"], e["done"]), lambda r, d, done: n_step_returns(r, d, done, 3)),
    "n_step_bootstrapped": (
        lambda e: (e["reward"], e["discount"], e["next_value"], e["done"]),
        lambda r, d, nv, done: n_step_bootstrapped_returns(r, d, nv, done, 3),
    ),
    "lambda": (
        lambda e: (e["reward"], e["next_value"], e["discount"], e["done"]),
        lambda *a: lambda_returns(*a, 0.9),
    ),
    "gae": (lambda e: (e["reward"], e["value"], e["next_value"], e["discount"], e["done"]), lambda *a: gae(*a, 0.9)),
    "vtrace": (
        lambda e: (e["log_rho"], e["reward"], e["value"], e["next_value"], e["discount"], e["done"]),
        lambda *a: vtrace(*a, 0.9),
    ),
    "retrace": (
        lambda e: (e["value"], e["next_value"], e["value"], e["reward"], e["discount"], e["done"], e["log_rho"]),
        retrace,
    ),
    "value_rescale": (lambda e: (e["reward"] * 100,), lambda x: signed_parabolic(signed_hyperbolic(x) + 0.1)),
}


@pytest.mark.parametrize("name", list(VMAP_CASES))
def test_vmap_equals_loop(name):
    select, fn = VMAP_CASES[name]
    args = select(_stacked())
    got = torch.func.vmap(fn)(*args)
    per_item = [fn(*(a[k] for a in args)) for k in range(args[0].shape[0])]
    if isinstance(got, tuple):
        for i, part in enumerate(got):
            torch.testing.assert_close(part, torch.stack([p[i] for p in per_item]))
    else:
        torch.testing.assert_close(got, torch.stack(per_item))


def test_vmap_over_lambda_hyperparameter():
    e = _stacked()
    lams = torch.tensor([0.0, 0.5, 0.95], dtype=F64)
    args = (e["reward"], e["value"], e["next_value"], e["discount"], e["done"])
    got = torch.func.vmap(gae)(*args, lams)
    for k in range(3):
        torch.testing.assert_close(got[k], ref_gae(*(a[k] for a in args), lams[k].item()))


# --------------------------------------------------------------------------- grad


def test_grad_through_gae_matches_reference_autograd():
    ep = episodes(seed=2)
    r, nv, d, done = ep["reward"], ep["next_value"], ep["discount"], ep["done"]
    loss = lambda adv: (adv**2).sum()  # noqa: E731
    got = torch.func.grad(lambda v: loss(gae(r, v, nv, d, done, 0.9)))(ep["value"])
    value = ep["value"].clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(loss(ref_gae(r, value, nv, d, done, 0.9)), value)
    torch.testing.assert_close(got, expected)


def test_grad_through_lambda_returns_matches_reference_autograd():
    ep = episodes(seed=6)
    r, d, done = ep["reward"], ep["discount"], ep["done"]
    weights = torch.linspace(-1, 1, r.numel(), dtype=F64).reshape(r.shape)
    got = torch.func.grad(lambda nv: (weights * lambda_returns(r, nv, d, done, 0.8)).sum())(ep["next_value"])
    nv = ep["next_value"].clone().requires_grad_(True)
    (expected,) = torch.autograd.grad((weights * ref_lambda(r, nv, d, done, 0.8)).sum(), nv)
    torch.testing.assert_close(got, expected)


def test_vtrace_and_retrace_stop_target_gradients():
    ep = episodes(seed=8)
    rest = (ep["next_value"], ep["discount"], ep["done"])

    def vtrace_loss(value, stop):
        vs, pg = vtrace(ep["log_rho"], ep["reward"], value, *rest, 0.9, stop_target_gradients=stop)
        return vs.sum() + pg.sum()

    assert (torch.func.grad(vtrace_loss)(ep["value"], True) == 0).all()
    got = torch.func.grad(vtrace_loss)(ep["value"], False)
    value = ep["value"].clone().requires_grad_(True)
    ref_vs, ref_pg = ref_vtrace(ep["log_rho"], ep["reward"], value, *rest, 0.9)
    (expected,) = torch.autograd.grad(ref_vs.sum() + ref_pg.sum(), value)
    torch.testing.assert_close(got, expected)

    x = retrace_inputs()
    retrace_loss = lambda q, stop: retrace(  # noqa: E731
        x["q_taken"], x["expected_next_q"], q, x["reward"], x["discount"], x["done"], x["log_rho"], 1.0,
        stop_target_gradients=stop,
    ).sum()
    assert (torch.func.grad(retrace_loss)(x["next_q_taken"], True) == 0).all()
    assert torch.func.grad(retrace_loss)(x["next_q_taken"], False).abs().sum() > 0


def test_grad_of_value_rescale():
    x = t64(-5.0, 0.0, 2.0)
    grad_identity = torch.func.vmap(torch.func.grad(lambda y: signed_parabolic(signed_hyperbolic(y))))(x)
    torch.testing.assert_close(grad_identity, torch.ones_like(x))
    slope_at_zero = torch.func.grad(signed_hyperbolic)(torch.tensor(0.0, dtype=F64))
    torch.testing.assert_close(slope_at_zero, torch.tensor(0.501, dtype=F64))  # h'(0) = 1/2 + eps


# --------------------------------------------------------------------------- argument errors


def _error_cases():
    ep = episodes(T=6, B=2)
    r, v, nv, d, done, lr = (ep[k] for k in ("reward", "value", "next_value", "discount", "done", "log_rho"))
    longer = torch.zeros(7, 2, dtype=F64)
    return {
        "value": lambda: gae(r, longer, nv, d, done, 0.9),  # T mismatch
        "next_value": lambda: gae(r, v, torch.zeros(6, 3, dtype=F64), d, done, 0.9),  # trailing dims
        "reward": lambda: gae(r > 0, v, nv, d, done, 0.9),  # bool reward
        "done": lambda: gae(r, v, nv, d, done.double(), 0.9),  # float done
        "b": lambda: reverse_linear_recurrence(torch.tensor(1.0), torch.tensor(0.5)),  # rank 0
        "bootstrap": lambda: discounted_returns(r, d, torch.zeros(3, dtype=F64)),
        "n": lambda: n_step_returns(r, d, done, 0),
        "lam": lambda: lambda_returns(r, nv, d, done, torch.ones(2)),
        "log_rho": lambda: vtrace(lr.long(), r, v, nv, d, done),
        "log_rho_next": lambda: retrace(v, nv, v, r, d, done, lr[:3]),
        "x": lambda: signed_hyperbolic(torch.arange(3)),
    }


ERROR_CASES = ["value", "next_value", "reward", "done", "b", "bootstrap", "n", "lam", "log_rho", "log_rho_next", "x"]


@pytest.mark.parametrize("name", ERROR_CASES)
def test_wrong_arguments_raise_value_error_naming_them(name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        _error_cases()[name]()
