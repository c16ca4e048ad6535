"""Tests for fnrl/losses.py: hand-computed examples, plain-loop references, identities,
compile / vmap / grad behaviour and argument validation."""
from __future__ import annotations

import math

import pytest
import torch

from fnrl import losses as L

D = torch.float64


def t(*values, dtype=D):
    return torch.tensor(values, dtype=dtype)


def close(actual, expected, atol=1e-9):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    if expected.ndim == 0:  # a plain number stands for every element
        expected = expected.expand_as(actual)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=1e-7)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=D)


# ---------------------------------------------------------------------------
# Plain-loop references (scalar Python over every element)
# ---------------------------------------------------------------------------


def ref_huber(x, delta):
    return 0.5 * x * x if abs(x) <= delta else delta * (abs(x) - 0.5 * delta)


def ref_projection(support, probs, target_support):
    """Bellemare et al. 2017, Algorithm 1, one sample, atom by atom (with the l == u case
    giving all the mass to that atom, the usual fix of the published pseudo-code)."""
    m = len(target_support)
    v_min, v_max = target_support[0], target_support[-1]
    dz = (v_max - v_min) / (m - 1)
    out = [0.0] * m
    for z, p in zip(support, probs):
        tz = min(max(z, v_min), v_max)
        b = (tz - v_min) / dz
        lo, up = math.floor(b), math.ceil(b)
        if lo == up:
            out[lo] += p
        else:
            out[lo] += p * (up - b)
            out[up] += p * (b - lo)
    return out


def ref_quantile_huber(pred, target, taus, kappa):
    total = 0.0
    for i, p in enumerate(pred):
        acc = 0.0
        for y in target:
            u = y - p
            acc += abs(taus[i] - (1.0 if u < 0 else 0.0)) * ref_huber(u, kappa) / kappa
        total += acc / len(target)
    return total


# ---------------------------------------------------------------------------
# Policy gradient family
# ---------------------------------------------------------------------------


def test_policy_gradient_hand_and_detached_advantage():
    logp = t(-0.5, -2.0).requires_grad_()
    adv = t(2.0, -1.0).requires_grad_()
    loss = L.policy_gradient_loss(logp, adv)
    close(loss, [1.0, -2.0])
    loss.sum().backward()
    close(logp.grad, [-2.0, 1.0])
    assert adv.grad is None


def test_clipped_surrogate_hand():
    # r = 1.1 (inside), 1.5 with A>0 (clipped to 1.2), 0.5 with A<0 (clipped to 0.8),
    # 0.7 with A>0 (outside the range, but the unclipped term is the smaller one).
    ratio = t(1.1, 1.5, 0.5, 0.7)
    adv = t(1.0, 1.0, -1.0, 2.0)
    loss, clipped = L.clipped_surrogate_loss(ratio.log(), torch.zeros_like(ratio), adv, 0.2)
    close(loss, [-1.1, -1.2, 0.8, -1.4])
    close(clipped, [0.0, 1.0, 1.0, 1.0])
    assert clipped.dtype == D


def test_clipped_surrogate_loop(gen):
    logp, old, adv = randn(gen, 5, 3) * 0.3, randn(gen, 5, 3) * 0.3, randn(gen, 5, 3)
    loss, clipped = L.clipped_surrogate_loss(logp, old, adv, 0.2)
    for i in range(5):
        for j in range(3):
            r = math.exp(logp[i, j].item() - old[i, j].item())
            a = adv[i, j].item()
            expect = -min(r * a, min(max(r, 0.8), 1.2) * a)
            assert loss[i, j].item() == pytest.approx(expect, abs=1e-12)
            assert clipped[i, j].item() == float(abs(r - 1) > 0.2)


def test_clipped_surrogate_unclipped_equals_ratio_times_advantage(gen):
    logp, old, adv = randn(gen, 64) * 0.05, randn(gen, 64) * 0.05, randn(gen, 64)
    loss, clipped = L.clipped_surrogate_loss(logp, old, adv, 0.3)
    inside = clipped == 0
    assert inside.all()
    close(loss, -torch.exp(logp - old) * adv)


def test_clipped_surrogate_gradient_zero_past_clip_in_improving_direction():
    # r = 1.5 with A > 0 and r = 0.5 with A < 0: already improved past the clip -> no gradient.
    # r = 0.5 with A > 0 and r = 1.5 with A < 0: clipped == 1 but still gets -A r gradient.
    ratio = t(1.5, 0.5, 0.5, 1.5)
    adv = t(1.0, -1.0, 1.0, -1.0)
    logp = ratio.log().requires_grad_()
    loss, clipped = L.clipped_surrogate_loss(logp, torch.zeros(4, dtype=D), adv, 0.2)
    loss.sum().backward()
    close(clipped, [1.0, 1.0, 1.0, 1.0])
    close(logp.grad, [0.0, 0.0, -0.5, 1.5])


def test_kl_penalty_hand_and_loop(gen):
    ratio = t(1.0, 2.0)
    loss = L.kl_penalty_loss(ratio.log(), t(0.0, 0.0), t(1.0, -1.0), t(0.1, 0.3), 0.5)
    close(loss, [-1.0 + 0.05, 2.0 + 0.15])
    logp, old, adv, kl = randn(gen, 4, 2), randn(gen, 4, 2), randn(gen, 4, 2), randn(gen, 4, 2).abs()
    loss = L.kl_penalty_loss(logp, old, adv, kl, torch.tensor(0.7, dtype=D))
    for i in range(4):
        for j in range(2):
            expect = -math.exp(logp[i, j] - old[i, j]) * adv[i, j] + 0.7 * kl[i, j]
            assert loss[i, j].item() == pytest.approx(expect.item(), abs=1e-12)


def test_adaptive_kl_coef_directions():
    kl = t(0.02, 0.005, 0.01, 0.014, 0.007)  # target 0.01, factor 1.5: bounds 0.015 / 0.00667
    beta = L.adaptive_kl_coef(1.0, kl, 0.01)
    assert torch.is_tensor(beta) and beta.dtype == D and beta.shape == kl.shape
    close(beta, [2.0, 0.5, 1.0, 1.0, 1.0])
    beta = L.adaptive_kl_coef(torch.tensor(3.0, dtype=D), torch.tensor(1.0, dtype=D), torch.tensor(0.01, dtype=D))
    assert beta.shape == () and beta.item() == 6.0
    beta = L.adaptive_kl_coef(3.0, torch.tensor(0.0, dtype=D), 0.01, factor=2.0, scale=3.0)
    assert beta.item() == pytest.approx(1.0)


def test_approx_kl_hand_loop_and_identities(gen):
    # r = 2: (2 - 1) - log 2; r = 0.5: (0.5 - 1) + log 2; r = 1: 0.
    close(L.approx_kl(t(math.log(2.0), -math.log(2.0), 0.3), t(0.0, 0.0, 0.3)),
          [1 - math.log(2.0), -0.5 + math.log(2.0), 0.0])
    logp, old = randn(gen, 20), randn(gen, 20)
    k3 = L.approx_kl(logp, old)
    for i in range(20):
        r = math.exp(logp[i] - old[i])
        assert k3[i].item() == pytest.approx((r - 1) - math.log(r), rel=1e-10)
    assert (k3 >= 0).all()


def test_approx_kl_is_unbiased_for_kl_old_new():
    gen = torch.Generator().manual_seed(1)
    old_p = t(0.5, 0.3, 0.2)
    new_p = t(0.2, 0.5, 0.3)
    actions = torch.multinomial(old_p, 400_000, replacement=True, generator=gen)
    estimate = L.approx_kl(new_p.log()[actions], old_p.log()[actions]).mean()
    exact = (old_p * (old_p.log() - new_p.log())).sum()
    assert estimate.item() == pytest.approx(exact.item(), abs=3e-3)


def test_entropy_and_dpg_are_negations():
    close(L.entropy_loss(t(0.7, 1.2)), [-0.7, -1.2])
    q = t(3.0, -1.0).requires_grad_()
    loss = L.dpg_loss(q)
    close(loss, [-3.0, 1.0])
    loss.sum().backward()
    close(q.grad, [-1.0, -1.0])


# ---------------------------------------------------------------------------
# Value losses
# ---------------------------------------------------------------------------


def test_squared_and_huber_hand():
    close(L.squared_loss(t(2.0, -0.5)), [2.0, 0.125])
    close(L.huber_loss(t(0.5, -2.0, 3.0)), [0.125, 1.5, 2.5])
    close(L.huber_loss(t(3.0, -1.0), delta=2.0), [4.0, 0.5])


def test_huber_loop_identities_and_gradient(gen):
    x = randn(gen, 50) * 3
    for delta in (0.5, 1.0, 2.0):
        h = L.huber_loss(x, delta)
        close(h, [ref_huber(v, delta) for v in x.tolist()])
    small = randn(gen, 50).clamp(-0.99, 0.99)
    close(L.huber_loss(small), L.squared_loss(small))
    x = x.clone().requires_grad_()
    L.huber_loss(x, 1.0).sum().backward()
    close(x.grad, x.detach().clamp(-1, 1))


def test_clipped_value_loss_hand_and_loop(gen):
    loss = L.clipped_value_loss(t(1.5, 3.0, 1.1), t(1.0, 1.0, 1.0), t(2.0, 2.0, 2.0), 0.2)
    close(loss, [0.5 * 0.64, 0.5 * 1.0, 0.5 * 0.81])
    v, old, g = randn(gen, 6, 2), randn(gen, 6, 2), randn(gen, 6, 2)
    loss = L.clipped_value_loss(v, old, g, torch.tensor(0.3, dtype=D))
    for i in range(6):
        for j in range(2):
            vv, oo, gg = v[i, j].item(), old[i, j].item(), g[i, j].item()
            vc = oo + min(max(vv - oo, -0.3), 0.3)
            assert loss[i, j].item() == pytest.approx(0.5 * max((vv - gg) ** 2, (vc - gg) ** 2), abs=1e-12)


# ---------------------------------------------------------------------------
# Q-learning family
# ---------------------------------------------------------------------------


def test_q_learning_and_double_q_hand():
    q = t(1.0, 2.0, 3.0)[None]
    action = torch.tensor([1])
    reward, discount = t(1.0), t(0.9)
    next_target = t(0.0, 5.0, 2.0)[None]
    next_online = t(3.0, 0.0, 1.0)[None]
    close(L.q_learning_td(q, action, reward, discount, next_target), [1.0 + 0.9 * 5.0 - 2.0])
    close(L.double_q_learning_td(q, action, reward, discount, next_target, next_online), [1.0 + 0.9 * 0.0 - 2.0])


def test_q_learning_and_double_q_loop(gen):
    T, B, A = 4, 3, 5
    q, nt, no = randn(gen, T, B, A), randn(gen, T, B, A), randn(gen, T, B, A)
    action = torch.randint(A, (T, B), generator=gen)
    reward = randn(gen, T, B)
    discount = 0.99 * (torch.rand(T, B, generator=gen) > 0.3).to(D)  # some terminal steps
    td = L.q_learning_td(q, action, reward, discount, nt)
    dtd = L.double_q_learning_td(q, action, reward, discount, nt, no)
    for i in range(T):
        for j in range(B):
            a = action[i, j].item()
            qa = q[i, j, a].item()
            r, d = reward[i, j].item(), discount[i, j].item()
            assert td[i, j].item() == pytest.approx(r + d * max(nt[i, j].tolist()) - qa, abs=1e-12)
            a_star = max(range(A), key=lambda k: no[i, j, k].item())
            assert dtd[i, j].item() == pytest.approx(r + d * nt[i, j, a_star].item() - qa, abs=1e-12)
    close(L.double_q_learning_td(q, action, reward, discount, nt, nt), td)


def test_q_learning_target_is_detached(gen):
    q = randn(gen, 3, 4).requires_grad_()
    next_q = randn(gen, 3, 4).requires_grad_()
    action = torch.tensor([0, 3, 1])
    td = L.q_learning_td(q, action, randn(gen, 3), torch.full((3,), 0.9, dtype=D), next_q)
    td.sum().backward()
    assert next_q.grad is None
    expected = torch.zeros(3, 4, dtype=D)
    expected[torch.arange(3), action] = -1.0
    close(q.grad, expected)


# C51 -------------------------------------------------------------------------


def test_projection_point_mass_splits_by_distance():
    target = t(0.0, 1.0, 2.0, 3.0, 4.0)
    close(L.categorical_projection(t(1.3), t(1.0), target), [0.0, 0.7, 0.3, 0.0, 0.0])
    # outside the range: clipped to the ends
    close(L.categorical_projection(t(-5.0, 9.0), t(0.25, 0.75), target), [0.25, 0.0, 0.0, 0.0, 0.75])


def test_projection_loop_mass_and_identity(gen):
    target = torch.linspace(-3.0, 3.0, 11, dtype=D)
    probs = torch.softmax(randn(gen, 4, 2, 7), -1)
    support = randn(gen, 4, 2, 7) * 3  # some atoms beyond [v_min, v_max]
    out = L.categorical_projection(support, probs, target)
    assert out.shape == (4, 2, 11)
    for i in range(4):
        for j in range(2):
            close(out[i, j], ref_projection(support[i, j].tolist(), probs[i, j].tolist(), target.tolist()), atol=1e-12)
    close(out.sum(-1), torch.ones(4, 2, dtype=D), atol=1e-12)
    same = torch.softmax(randn(gen, 4, 11), -1)
    close(L.categorical_projection(target, same, target), same, atol=1e-12)


def test_projection_broadcasts_plain_support(gen):
    target = torch.linspace(-1.0, 1.0, 5, dtype=D)
    support = torch.linspace(-2.0, 2.0, 7, dtype=D)
    probs = torch.softmax(randn(gen, 3, 7), -1)
    out = L.categorical_projection(support, probs, target)
    close(out, L.categorical_projection(support.expand(3, 7), probs, target))


def test_categorical_q_target_hand():
    support = t(-1.0, 0.0, 1.0)
    next_probs = t(0.2, 0.5, 0.3)[None]
    # atoms r + discount z = [0, 0.5, 1]: 0.2 -> z=0; 0.5 splits 0.25/0.25; 0.3 -> z=1
    close(L.categorical_q_target(t(0.5), t(0.5), next_probs, support), [[0.0, 0.45, 0.55]])
    # terminal: all mass at r (and r clipped to v_max)
    close(L.categorical_q_target(t(0.5, 5.0), t(0.0, 0.0), next_probs.expand(2, 3), support),
          [[0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])


def test_categorical_cross_entropy_hand_and_gradient():
    logits = t(0.0, math.log(3.0)).requires_grad_()  # softmax = [0.25, 0.75]
    target = t(0.5, 0.5).requires_grad_()
    ce = L.categorical_cross_entropy(logits, target)
    close(ce, -(0.5 * math.log(0.25) + 0.5 * math.log(0.75)))
    ce.backward()
    close(logits.grad, [0.25 - 0.5, 0.75 - 0.5])
    assert target.grad is None


def test_categorical_td_loss_matches_loop(gen):
    T, B, A, N = 3, 2, 4, 5
    support = torch.linspace(-2.0, 2.0, N, dtype=D)
    logits = randn(gen, T, B, A, N)
    next_probs = torch.softmax(randn(gen, T, B, A, N), -1)
    action = torch.randint(A, (T, B), generator=gen)
    next_action = torch.randint(A, (T, B), generator=gen)
    reward = randn(gen, T, B)
    discount = 0.9 * (torch.rand(T, B, generator=gen) > 0.3).to(D)
    loss = L.categorical_td_loss(logits, action, reward, discount, next_probs, next_action, support)
    for i in range(T):
        for j in range(B):
            atoms = [reward[i, j].item() + discount[i, j].item() * z for z in support.tolist()]
            m = ref_projection(atoms, next_probs[i, j, next_action[i, j]].tolist(), support.tolist())
            logsm = torch.log_softmax(logits[i, j, action[i, j]], -1).tolist()
            assert loss[i, j].item() == pytest.approx(-sum(p * lp for p, lp in zip(m, logsm)), abs=1e-10)


# Quantile regression -----------------------------------------------------------


def test_quantile_huber_hand():
    # i=0 (tau .25): u = [0.5, 3]  -> .25 * mean(0.125, 2.5)            = 0.328125
    # i=1 (tau .75): u = [-0.5, 2] -> mean(.25 * 0.125, .75 * 1.5)       = 0.578125
    loss = L.quantile_huber_loss(t(0.0, 1.0), t(0.5, 3.0), t(0.25, 0.75))
    close(loss, 0.90625)


def test_quantile_huber_loop_and_tau_shapes(gen):
    B, N, M = 4, 3, 5
    pred, target = randn(gen, 2, B, N), randn(gen, 2, B, M) * 2
    taus = torch.rand(2, B, N, generator=gen, dtype=D)
    for kappa in (1.0, 0.5):
        loss = L.quantile_huber_loss(pred, target, taus, kappa)
        assert loss.shape == (2, B)
        for k in range(2):
            for b in range(B):
                expect = ref_quantile_huber(pred[k, b].tolist(), target[k, b].tolist(), taus[k, b].tolist(), kappa)
                assert loss[k, b].item() == pytest.approx(expect, abs=1e-12)
    mid = L.quantile_midpoints(N, dtype=D)
    close(L.quantile_huber_loss(pred, target, mid), L.quantile_huber_loss(pred, target, mid.expand(2, B, N)))


def test_quantile_huber_target_detached(gen):
    pred, target = randn(gen, 3).requires_grad_(), randn(gen, 4).requires_grad_()
    L.quantile_huber_loss(pred, target, L.quantile_midpoints(3, dtype=D)).backward()
    assert target.grad is None and pred.grad is not None


def test_quantile_midpoints():
    close(L.quantile_midpoints(4, dtype=D), [0.125, 0.375, 0.625, 0.875])
    assert L.quantile_midpoints(3).dtype == torch.float32


# ---------------------------------------------------------------------------
# Deterministic / soft actor-critic
# ---------------------------------------------------------------------------


def test_td3_target_action_zero_noise_is_exact(gen):
    a = torch.rand(6, 2, generator=gen, dtype=D) * 2 - 1
    out = L.td3_target_action(a, 0.0, 0.5, -1.0, 1.0)
    assert torch.equal(out, a)
    assert torch.equal(L.td3_target_action(a, torch.tensor(0.0, dtype=D), 0.5, -1.0, 1.0), a)


def test_td3_target_action_respects_clips():
    torch.manual_seed(0)
    zero = torch.zeros(2000, 2, dtype=D)
    out = L.td3_target_action(zero, 10.0, 0.5, -1.0, 1.0)
    assert out.abs().max().item() == 0.5  # noise clipped at c, and it does hit the clip
    near_edge = torch.full((2000, 2), 0.9, dtype=D)
    low, high = t(-1.0, -0.5), t(1.0, 0.95)  # per-dimension bounds
    out = L.td3_target_action(near_edge, 10.0, 0.5, low, high)
    assert (out <= high).all() and (out >= near_edge - 0.5).all()
    assert out[:, 1].max().item() == 0.95 and out[:, 0].max().item() == 1.0


def test_twin_q_target_hand_and_detached():
    q1 = t(2.0).requires_grad_()
    y = L.twin_q_target(t(1.0), t(0.9), q1, t(3.0), t(-1.0), 0.5)
    close(y, 1.0 + 0.9 * (2.0 + 0.5))
    assert not y.requires_grad
    close(L.twin_q_target(t(1.0, 1.0), t(0.9, 0.0), t(2.0, 2.0), t(3.0, 1.0)), [1.0 + 0.9 * 2.0, 1.0])


def test_sac_actor_and_temperature_hand():
    alpha = torch.tensor(0.2, dtype=D, requires_grad=True)
    logp = t(-1.0).requires_grad_()
    loss = L.sac_actor_loss(logp, t(2.0), alpha)
    close(loss, -0.2 - 2.0)
    loss.sum().backward()
    assert alpha.grad is None
    close(logp.grad, [0.2])
    log_alpha = torch.tensor(0.5, dtype=D, requires_grad=True)
    logp = t(-1.0, -3.0).requires_grad_()
    loss = L.sac_temperature_loss(log_alpha, logp, -2.0)
    close(loss, [-0.5 * -3.0, -0.5 * -5.0])
    loss.sum().backward()
    assert logp.grad is None
    close(log_alpha.grad, 3.0 + 5.0)


# ---------------------------------------------------------------------------
# Hyperparameters: Python float == 0-d tensor
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda h, x: L.clipped_surrogate_loss(x[0] * 0.3, x[1] * 0.3, x[2], h),
        lambda h, x: L.kl_penalty_loss(x[0], x[1], x[2], x[3].abs(), h),
        lambda h, x: L.huber_loss(x[0] * 2, h),
        lambda h, x: L.clipped_value_loss(x[0], x[1], x[2], h),
        lambda h, x: L.quantile_huber_loss(x[0], x[1], L.quantile_midpoints(5, dtype=D), h),
        lambda h, x: L.td3_target_action(x[0], 0.0, h, -h, h),
        lambda h, x: L.twin_q_target(x[0], x[1], x[2], x[3], x[0], h),
        lambda h, x: L.sac_actor_loss(x[0], x[1], h),
        lambda h, x: L.sac_temperature_loss(x[0][0, 0], x[1], h),
        lambda h, x: L.adaptive_kl_coef(h, x[0].abs(), h),
    ],
)
def test_hyperparameter_float_or_tensor(fn, gen):
    x = [randn(gen, 3, 5) for _ in range(4)]
    as_float = fn(0.4, x)
    as_tensor = fn(torch.tensor(0.4, dtype=D), x)
    for a, b in zip(as_float if isinstance(as_float, tuple) else (as_float,),
                    as_tensor if isinstance(as_tensor, tuple) else (as_tensor,)):
        close(b, a)


# ---------------------------------------------------------------------------
# torch.compile (each compiled once), vmap, grad
# ---------------------------------------------------------------------------

compiled_surrogate = torch.compile(L.clipped_surrogate_loss, fullgraph=True)
compiled_projection = torch.compile(L.categorical_projection, fullgraph=True)
compiled_quantile = torch.compile(L.quantile_huber_loss, fullgraph=True)
compiled_huber = torch.compile(L.huber_loss, fullgraph=True)


def _compile_cases(gen):
    f = torch.float32
    target = torch.linspace(-2.0, 2.0, 9)
    taus = L.quantile_midpoints(4)
    return [
        (compiled_surrogate, L.clipped_surrogate_loss,
         lambda: (torch.randn(8, 3, generator=gen) * 0.3, torch.randn(8, 3, generator=gen) * 0.3,
                  torch.randn(8, 3, generator=gen), torch.rand((), generator=gen) * 0.3)),
        (compiled_projection, L.categorical_projection,
         lambda: (torch.randn(8, 3, 6, generator=gen) * 2, torch.softmax(torch.randn(8, 3, 6, generator=gen), -1), target)),
        (compiled_quantile, L.quantile_huber_loss,
         lambda: (torch.randn(8, 4, generator=gen), torch.randn(8, 5, generator=gen), taus, torch.tensor(1.0, dtype=f))),
        (compiled_huber, L.huber_loss, lambda: (torch.randn(8, 3, generator=gen) * 3, torch.tensor(1.0, dtype=f))),
    ]


def test_compiled_equals_eager_without_recompiling(gen):
    for compiled, eager, make_args in _compile_cases(gen):
        for call in range(2):
            args = make_args()
            if call == 0:
                got = compiled(*args)
            else:  # new values, same shapes: the graph is reused
                with torch.compiler.set_stance("fail_on_recompile"):
                    got = compiled(*args)
            want = eager(*args)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_vmap_over_clip_hyperparameter_equals_loop(gen):
    logp, old, adv = randn(gen, 6, 2) * 0.3, randn(gen, 6, 2) * 0.3, randn(gen, 6, 2)
    clips = t(0.05, 0.1, 0.2, 0.3)
    loss, clipped = torch.func.vmap(L.clipped_surrogate_loss, in_dims=(None, None, None, 0))(logp, old, adv, clips)
    for k, c in enumerate(clips.tolist()):
        want_loss, want_clipped = L.clipped_surrogate_loss(logp, old, adv, c)
        close(loss[k], want_loss)
        close(clipped[k], want_clipped)


def test_vmap_projection_and_double_q_equal_loop(gen):
    target = torch.linspace(-1.0, 1.0, 7, dtype=D)
    support, probs = randn(gen, 5, 4), torch.softmax(randn(gen, 5, 4), -1)
    out = torch.func.vmap(L.categorical_projection, in_dims=(0, 0, None))(support, probs, target)
    for b in range(5):
        close(out[b], L.categorical_projection(support[b], probs[b], target))
    q, nt, no = randn(gen, 5, 3), randn(gen, 5, 3), randn(gen, 5, 3)
    action, reward, discount = torch.randint(3, (5,), generator=gen), randn(gen, 5), torch.full((5,), 0.9, dtype=D)
    td = torch.func.vmap(L.double_q_learning_td)(q, action, reward, discount, nt, no)
    close(td, L.double_q_learning_td(q, action, reward, discount, nt, no))


def test_vmap_td3_noise_is_different_per_example():
    torch.manual_seed(0)
    a = torch.zeros(4, 3, 2)
    out = torch.func.vmap(lambda x: L.td3_target_action(x, 0.2, 0.5, -1.0, 1.0), randomness="different")(a)
    assert not torch.equal(out[0], out[1])
    assert out.abs().max() <= 0.5


def test_func_grad_of_clipped_surrogate(gen):
    logp, old, adv = randn(gen, 16) * 0.3, randn(gen, 16) * 0.3, randn(gen, 16)
    g = torch.func.grad(lambda lp: L.clipped_surrogate_loss(lp, old, adv, 0.2)[0].mean())(logp)
    r = torch.exp(logp - old)
    active = (r * adv) <= (r.clamp(0.8, 1.2) * adv)  # the unclipped term is the minimum
    close(g, torch.where(active, -r * adv, torch.zeros_like(r)) / 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clipped_surrogate_gradient_equals_the_minimum_form(gen, dtype):
    """The loss and its gradient are exactly those of -min(r A, clip(r, 1 - eps, 1 + eps) A) through
    autograd (whose minimum splits ties in halves): inside the range, past it, at its edges, and A = 0."""
    ratio = torch.cat([torch.exp(randn(gen, 256) * 0.3), torch.tensor([0.8, 1.2, 1.0, 0.5, 1.5], dtype=D)]).to(dtype)
    adv = torch.cat([randn(gen, 256), torch.tensor([1.0, -1.0, 0.0, 0.0, 2.0], dtype=D)]).to(dtype)
    old = randn(gen, 261).to(dtype) * 0.1

    def reference(logp):
        r = torch.exp(logp - old)
        return -torch.minimum(r * adv, torch.clamp(torch.clamp(r, min=0.8), max=1.2) * adv)

    grads = []
    for loss_fn in (lambda lp: L.clipped_surrogate_loss(lp, old, adv, 0.2)[0], reference):
        logp = (ratio.log() + old).requires_grad_()
        loss = loss_fn(logp)
        loss.sum().backward()
        grads.append((loss.detach(), logp.grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


def test_func_grad_of_categorical_cross_entropy(gen):
    logits, target = randn(gen, 3, 5), torch.softmax(randn(gen, 3, 5), -1)
    g = torch.func.grad(lambda x: L.categorical_cross_entropy(x, target).sum())(logits)
    close(g, torch.softmax(logits, -1) - target)
    per_example = torch.func.vmap(torch.func.grad(lambda x, m: L.categorical_cross_entropy(x, m)))(logits, target)
    close(per_example, g)


# ---------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------

x3 = torch.zeros(3)
q34 = torch.zeros(3, 4)
a3 = torch.zeros(3, dtype=torch.int64)
sup5 = torch.linspace(-1, 1, 5)


@pytest.mark.parametrize(
    "name, call",
    [
        ("logp", lambda: L.policy_gradient_loss(torch.zeros(3, dtype=torch.bool), x3)),
        ("advantage", lambda: L.policy_gradient_loss(x3, torch.zeros(3, 1))),
        ("advantage", lambda: L.clipped_surrogate_loss(x3, x3, torch.zeros(4), 0.2)),
        ("clip", lambda: L.clipped_surrogate_loss(x3, x3, x3, torch.tensor([0.1, 0.2]))),
        ("clip", lambda: L.clipped_surrogate_loss(x3, x3, x3, True)),
        ("kl", lambda: L.kl_penalty_loss(x3, x3, x3, torch.zeros(2), 1.0)),
        ("kl_mean", lambda: L.adaptive_kl_coef(1.0, torch.tensor(True), 0.01)),
        ("entropy", lambda: L.entropy_loss(torch.zeros(3, dtype=torch.int64))),
        ("x", lambda: L.huber_loss(torch.zeros(3, dtype=torch.bool))),
        ("delta", lambda: L.huber_loss(x3, "1")),
        ("target", lambda: L.clipped_value_loss(x3, x3, torch.zeros(2), 0.2)),
        ("action", lambda: L.q_learning_td(q34, torch.zeros(3), x3, x3, q34)),
        ("q", lambda: L.q_learning_td(torch.zeros(2, 4), a3, x3, x3, q34)),
        ("next_q_target", lambda: L.q_learning_td(q34, a3, x3, x3, torch.zeros(3, 5))),
        ("discount", lambda: L.double_q_learning_td(q34, a3, x3, torch.zeros(3, 1), q34, q34)),
        ("next_q_online", lambda: L.double_q_learning_td(q34, a3, x3, x3, q34, torch.zeros(3, 4, dtype=torch.bool))),
        ("target_support", lambda: L.categorical_projection(torch.zeros(2, 5), torch.zeros(2, 5), sup5[None])),
        ("probs", lambda: L.categorical_projection(torch.zeros(2, 5), torch.zeros(2, 4), sup5)),
        ("probs", lambda: L.categorical_projection(torch.zeros(3, 5), torch.zeros(2, 5), sup5)),
        ("next_probs", lambda: L.categorical_q_target(x3, x3, torch.zeros(2, 5), sup5)),
        ("target_probs", lambda: L.categorical_cross_entropy(torch.zeros(3, 5), torch.zeros(3, 4))),
        ("logits", lambda: L.categorical_td_loss(torch.zeros(3, 5), a3, x3, x3, torch.zeros(3, 5), a3, sup5)),
        ("next_action", lambda: L.categorical_td_loss(torch.zeros(3, 4, 5), a3, x3, x3, torch.zeros(3, 4, 5),
                                                      torch.zeros(3, dtype=torch.int32), sup5)),
        ("taus", lambda: L.quantile_huber_loss(q34, torch.zeros(3, 2), torch.zeros(5))),
        ("target", lambda: L.quantile_huber_loss(q34, torch.zeros(2, 2), torch.zeros(4))),
        ("kappa", lambda: L.quantile_huber_loss(q34, torch.zeros(3, 2), torch.zeros(4), 0.0)),
        ("n", lambda: L.quantile_midpoints(0)),
        ("q", lambda: L.dpg_loss(torch.zeros(3, dtype=torch.bool))),
        ("low", lambda: L.td3_target_action(q34, 0.1, 0.5, torch.zeros(3), 1.0)),
        ("noise_std", lambda: L.td3_target_action(q34, torch.zeros(4), 0.5, -1.0, 1.0)),
        ("next_logp", lambda: L.twin_q_target(x3, x3, x3, x3, torch.zeros(4), 0.2)),
        ("next_q2", lambda: L.twin_q_target(x3, x3, x3, torch.zeros(3, dtype=torch.bool))),
        ("alpha", lambda: L.sac_actor_loss(x3, x3, torch.tensor(1))),
        ("log_alpha", lambda: L.sac_temperature_loss(torch.zeros(2), x3, -1.0)),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(name, call):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        call()
