"""Tests for fnrl.distributions: hand values, torch.distributions references, identities,
sampling frequencies, gradients, vmap and compile."""
import math

import pytest
import torch
from torch.distributions import (
    Categorical,
    Independent,
    Normal,
    TanhTransform,
    TransformedDistribution,
    kl_divergence,
)
from torch.func import vmap

from fnrl.distributions import (
    categorical_entropy,
    categorical_kl,
    categorical_log_prob,
    categorical_mode,
    categorical_sample,
    epsilon_greedy,
    epsilon_greedy_probs,
    normal_entropy,
    normal_kl,
    normal_log_prob,
    normal_mode,
    normal_sample,
    sde_log_std,
    sde_noise,
    tanh_normal_log_prob,
    tanh_normal_mode,
    tanh_normal_sample,
)

F64 = torch.float64
N_SAMPLES = 100_000
# 5 standard deviations of a frequency estimate from 100k samples is at most 0.008
FREQ_TOL = 0.008
HALF_LOG_2PI = 0.9189385332046727


def frequencies(actions: torch.Tensor, num_actions: int) -> torch.Tensor:
    return torch.bincount(actions.flatten(), minlength=num_actions).to(F64) / actions.numel()


# ---------------------------------------------------------------------------
# categorical
# ---------------------------------------------------------------------------


def test_categorical_hand_values():
    logits = torch.log(torch.tensor([0.2, 0.3, 0.5], dtype=F64))
    uniform = torch.zeros(3, dtype=F64)
    torch.testing.assert_close(categorical_log_prob(logits, torch.tensor(2)), torch.tensor(math.log(0.5), dtype=F64))
    # H = -(0.2 ln 0.2 + 0.3 ln 0.3 + 0.5 ln 0.5)
    torch.testing.assert_close(categorical_entropy(logits), torch.tensor(1.0296530140645737, dtype=F64))
    # KL(p || uniform) = ln 3 - H(p)
    torch.testing.assert_close(categorical_kl(logits, uniform), torch.tensor(0.0689592746035361, dtype=F64))
    assert categorical_mode(logits).item() == 2
    assert categorical_mode(torch.tensor([1.0, 3.0, 3.0])).item() == 1  # first argmax on ties


def test_categorical_matches_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, 6, dtype=F64) * 2
    q_logits = torch.randn(4, 5, 6, dtype=F64) * 2
    action = torch.randint(0, 6, (4, 5))
    p, q = Categorical(logits=logits), Categorical(logits=q_logits)
    torch.testing.assert_close(categorical_log_prob(logits, action), p.log_prob(action))
    torch.testing.assert_close(categorical_entropy(logits), p.entropy())
    torch.testing.assert_close(categorical_kl(logits, q_logits), kl_divergence(p, q))
    torch.testing.assert_close(categorical_mode(logits), p.probs.argmax(-1))


def test_categorical_identities():
    torch.manual_seed(1)
    logits = torch.randn(7, 4, dtype=F64)
    # log-probs of all actions exponentiate to a distribution
    all_log_p = torch.stack([categorical_log_prob(logits, torch.full((7,), a)) for a in range(4)], -1)
    torch.testing.assert_close(all_log_p.exp().sum(-1), torch.ones(7, dtype=F64))
    # shift invariance, KL(p||p) = 0, 0 <= H <= log A
    torch.testing.assert_close(categorical_entropy(logits + 3.0), categorical_entropy(logits))
    torch.testing.assert_close(categorical_kl(logits, logits), torch.zeros(7, dtype=F64))
    entropy = categorical_entropy(logits)
    assert bool((entropy >= 0).all()) and bool((entropy <= math.log(4)).all())
    assert bool((categorical_kl(logits, torch.randn(7, 4, dtype=F64)) >= 0).all())


def test_categorical_masked_actions():
    masked = torch.tensor([0.0, -math.inf, math.log(3.0)], dtype=F64)  # p = [1/4, 0, 3/4]
    two_way = torch.tensor([0.0, math.log(3.0)], dtype=F64)
    torch.testing.assert_close(categorical_entropy(masked), categorical_entropy(two_way))
    torch.testing.assert_close(categorical_kl(masked, masked), torch.tensor(0.0, dtype=F64))
    torch.testing.assert_close(
        categorical_kl(masked, torch.zeros(3, dtype=F64)), math.log(3.0) - categorical_entropy(two_way)
    )
    torch.manual_seed(2)
    samples = categorical_sample(masked.expand(10_000, 3))
    assert not bool((samples == 1).any())


def test_categorical_sample_frequencies():
    torch.manual_seed(3)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    samples = categorical_sample(probs.log().float().expand(N_SAMPLES, 4))
    assert samples.dtype == torch.int64 and samples.shape == (N_SAMPLES,)
    torch.testing.assert_close(frequencies(samples, 4), probs, atol=FREQ_TOL, rtol=0)


def test_categorical_rejects_bad_action():
    logits = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="int64"):
        categorical_log_prob(logits, torch.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        categorical_log_prob(logits, torch.zeros(3, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="floating-point"):
        categorical_entropy(torch.zeros(3, 4, dtype=torch.int64))


# ---------------------------------------------------------------------------
# epsilon-greedy
# ---------------------------------------------------------------------------


def test_epsilon_greedy_probs_hand_values():
    q = torch.tensor([1.0, 3.0, 2.0], dtype=F64)
    # eps / A + (1 - eps) [a = argmax] with eps = 0.3, A = 3
    torch.testing.assert_close(epsilon_greedy_probs(q, 0.3), torch.tensor([0.1, 0.8, 0.1], dtype=F64))
    torch.testing.assert_close(epsilon_greedy_probs(q, torch.tensor(0.0)), torch.tensor([0.0, 1.0, 0.0], dtype=F64))
    torch.testing.assert_close(epsilon_greedy_probs(q, 1.0), torch.full((3,), 1 / 3, dtype=F64))


def test_epsilon_greedy_probs_per_env_epsilon_matches_loop():
    torch.manual_seed(4)
    T, B, A = 3, 5, 4
    q = torch.randn(T, B, A, dtype=F64)
    epsilon = torch.rand(B, dtype=F64)  # one epsilon per env, broadcast over time
    probs = epsilon_greedy_probs(q, epsilon)
    expected = torch.empty(T, B, A, dtype=F64)
    for t in range(T):
        for b in range(B):
            greedy = max(range(A), key=lambda a: q[t, b, a].item())
            for a in range(A):
                expected[t, b, a] = epsilon[b] / A + (1 - epsilon[b]) * (a == greedy)
    torch.testing.assert_close(probs, expected)
    torch.testing.assert_close(probs.sum(-1), torch.ones(T, B, dtype=F64))


def test_epsilon_greedy_extremes_and_dtype():
    torch.manual_seed(5)
    q = torch.randn(50, 6)
    greedy = epsilon_greedy(q, 0.0)
    assert greedy.dtype == torch.int64 and greedy.shape == (50,)
    assert torch.equal(greedy, q.argmax(-1))
    # per-env epsilon [B] with q [T, B, A]: env 0 is greedy, env 1 explores always
    q_tb = torch.randn(2000, 2, 6)
    actions = epsilon_greedy(q_tb, torch.tensor([0.0, 1.0]))
    assert actions.shape == (2000, 2)
    assert torch.equal(actions[:, 0], q_tb[:, 0].argmax(-1))
    torch.testing.assert_close(frequencies(actions[:, 1], 6), torch.full((6,), 1 / 6, dtype=F64), atol=0.04, rtol=0)


@pytest.mark.parametrize("epsilon", [0.3, torch.tensor(0.3)])
def test_epsilon_greedy_sample_frequencies(epsilon):
    torch.manual_seed(6)
    q = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.0])
    actions = epsilon_greedy(q.expand(N_SAMPLES, 5), epsilon)
    expected = epsilon_greedy_probs(q.to(F64), 0.3)
    torch.testing.assert_close(frequencies(actions, 5), expected, atol=FREQ_TOL, rtol=0)


# ---------------------------------------------------------------------------
# diagonal Gaussian
# ---------------------------------------------------------------------------


def test_normal_hand_values():
    zeros = torch.zeros(2, dtype=F64)
    x = torch.tensor([1.0, 0.0], dtype=F64)
    # -1/2 - 2 * log(2 pi) / 2
    torch.testing.assert_close(normal_log_prob(zeros, zeros, x), torch.tensor(-0.5 - 2 * HALF_LOG_2PI, dtype=F64))
    # 2 * (1/2 + log(2 pi) / 2)
    torch.testing.assert_close(normal_entropy(zeros), torch.tensor(1 + 2 * HALF_LOG_2PI, dtype=F64))
    # KL(N(0, 1) || N(1, 2^2)) = log 2 + (1 + 1) / 8 - 1/2 per dim
    log2 = torch.full((2,), math.log(2.0), dtype=F64)
    expected_kl = torch.tensor(2 * (math.log(2) - 0.25), dtype=F64)
    torch.testing.assert_close(normal_kl(zeros, zeros, zeros + 1, log2), expected_kl)
    assert normal_mode(x) is x


def test_normal_matches_torch_distributions():
    torch.manual_seed(7)
    mean_p, mean_q, x = (torch.randn(4, 3, 5, dtype=F64) for _ in range(3))
    log_std_p, log_std_q = (0.5 * torch.randn(4, 3, 5, dtype=F64) for _ in range(2))
    p = Independent(Normal(mean_p, log_std_p.exp()), 1)
    q = Independent(Normal(mean_q, log_std_q.exp()), 1)
    torch.testing.assert_close(normal_log_prob(mean_p, log_std_p, x), p.log_prob(x))
    torch.testing.assert_close(normal_entropy(log_std_p), p.entropy())
    torch.testing.assert_close(normal_kl(mean_p, log_std_p, mean_q, log_std_q), kl_divergence(p, q))
    torch.testing.assert_close(normal_kl(mean_p, log_std_p, mean_p, log_std_p), torch.zeros(4, 3, dtype=F64))
    # a state-independent log_std [D] broadcasts against a batch of means
    torch.testing.assert_close(
        normal_log_prob(mean_p, log_std_p[0, 0], x), Independent(Normal(mean_p, log_std_p[0, 0].exp()), 1).log_prob(x)
    )


def test_normal_sample_is_reparameterized_and_matches_torch():
    mean = torch.tensor([1.0, -2.0], dtype=F64)
    log_std = torch.tensor([0.0, math.log(3.0)], dtype=F64)
    torch.manual_seed(8)
    x = normal_sample(mean, log_std)
    torch.manual_seed(8)
    torch.testing.assert_close(x, Normal(mean, log_std.exp()).rsample())
    torch.manual_seed(9)
    many = normal_sample(mean.expand(N_SAMPLES, 2), log_std)
    torch.testing.assert_close(many.mean(0), mean, atol=0.03, rtol=0)
    torch.testing.assert_close(many.std(0), log_std.exp(), atol=0.03, rtol=0)


# ---------------------------------------------------------------------------
# tanh-squashed Gaussian
# ---------------------------------------------------------------------------


def test_sde_log_std_hand_example():
    # z = (1, 2), exp(log_std) = (1, 2) on one action dim: sigma^2 = 1^2 * 1^2 + 2^2 * 2^2 = 17
    latent = torch.tensor([[1.0, 2.0]], dtype=F64)
    log_std = torch.tensor([[0.0], [math.log(2.0)]], dtype=F64)
    torch.testing.assert_close(sde_log_std(latent, log_std), torch.tensor([[0.5 * math.log(17.0 + 1e-6)]], dtype=F64))


def test_sde_noise_equals_a_plain_loop():
    torch.manual_seed(13)
    latent, log_std = torch.randn(4, 3, dtype=F64), 0.3 * torch.randn(3, 2, dtype=F64)
    per_row, shared = torch.randn(4, 3, 2, dtype=F64), torch.randn(3, 2, dtype=F64)
    loop = torch.tensor([[sum(latent[n, l] * log_std[l, d].exp() * per_row[n, l, d] for l in range(3))
                          for d in range(2)] for n in range(4)], dtype=F64)
    torch.testing.assert_close(sde_noise(latent, log_std, per_row), loop)
    torch.testing.assert_close(sde_noise(latent, log_std, shared), sde_noise(latent, log_std, shared.expand(4, 3, 2)))


def test_sde_noise_has_the_std_of_sde_log_std_and_leaves_the_features_untrained():
    torch.manual_seed(14)
    latent = torch.randn(1, 8, dtype=F64, requires_grad=True)
    log_std = (0.3 * torch.randn(8, 2, dtype=F64)).requires_grad_()
    noise = sde_noise(latent.expand(50_000, 8), log_std, torch.randn(50_000, 8, 2, dtype=F64))
    torch.testing.assert_close(noise.std(0).log(), sde_log_std(latent, log_std)[0].detach(), rtol=0, atol=0.01)
    (sde_log_std(latent, log_std).sum() + noise.sum()).backward()
    assert latent.grad is None and log_std.grad is not None


def test_tanh_normal_hand_values():
    zeros = torch.zeros(3, dtype=F64)
    # at u = 0 the Jacobian is 1: log pi = log N(0; 0, 1) summed over 3 dims
    torch.testing.assert_close(tanh_normal_log_prob(zeros, zeros, zeros), torch.tensor(-3 * HALF_LOG_2PI, dtype=F64))
    torch.testing.assert_close(
        tanh_normal_mode(torch.tensor([0.5, -0.5], dtype=F64)),
        torch.tensor([0.46211715726000974, -0.46211715726000974], dtype=F64),
    )


def test_tanh_normal_matches_transformed_distribution():
    torch.manual_seed(10)
    mean = torch.randn(6, 3, dtype=F64)
    log_std = 0.5 * torch.randn(6, 3, dtype=F64)
    reference = TransformedDistribution(Independent(Normal(mean, log_std.exp()), 1), [TanhTransform(cache_size=1)])
    torch.manual_seed(11)
    expected_action = reference.rsample()
    expected_log_prob = reference.log_prob(expected_action)  # cache gives the exact pre-tanh value
    torch.manual_seed(11)
    action, log_prob = tanh_normal_sample(mean, log_std)
    torch.testing.assert_close(action, expected_action)
    torch.testing.assert_close(log_prob, expected_log_prob)


def test_tanh_normal_log_prob_equals_naive_change_of_variables():
    torch.manual_seed(12)
    mean = torch.randn(20, 4, dtype=F64)
    log_std = 0.3 * torch.randn(20, 4, dtype=F64)
    u = 3 * torch.rand(20, 4, dtype=F64) - 1.5
    naive = normal_log_prob(mean, log_std, u) - torch.log(1 - torch.tanh(u) ** 2).sum(-1)
    torch.testing.assert_close(tanh_normal_log_prob(mean, log_std, u), naive)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_tanh_normal_log_prob_finite_for_large_pre_tanh(dtype):
    u = torch.tensor([[-20.0], [-10.0], [10.0], [20.0]], dtype=dtype)
    zeros = torch.zeros_like(u)
    log_prob = tanh_normal_log_prob(zeros, zeros, u)
    assert bool(torch.isfinite(log_prob).all())
    # log(1 - tanh(u)^2) -> 2 log 2 - 2|u| for large |u|
    expected = -0.5 * u[:, 0] ** 2 - HALF_LOG_2PI - (2 * math.log(2.0) - 2 * u[:, 0].abs())
    torch.testing.assert_close(log_prob, expected)


def test_tanh_normal_sample_gradients_flow():
    mean = torch.tensor([[0.3, -0.2]], dtype=F64, requires_grad=True)
    log_std = torch.tensor([[-0.5, 0.1]], dtype=F64, requires_grad=True)
    torch.manual_seed(13)
    action, log_prob = tanh_normal_sample(mean, log_std)
    assert bool((action.abs() < 1).all())
    (action.sum() + log_prob.sum()).backward()
    for grad in (mean.grad, log_std.grad):
        assert grad is not None and bool(torch.isfinite(grad).all()) and bool((grad != 0).all())
    # d tanh(mean + std e) / d mean = 1 - tanh(u)^2, checked through torch.func
    torch.manual_seed(14)
    grad_mean = torch.func.grad(lambda m: tanh_normal_sample(m, log_std.detach())[0].sum())(mean.detach())
    torch.manual_seed(14)
    u = normal_sample(mean.detach(), log_std.detach())
    torch.testing.assert_close(grad_mean, 1 - torch.tanh(u) ** 2)


# ---------------------------------------------------------------------------
# vmap and compile
# ---------------------------------------------------------------------------

SAMPLERS = {
    "categorical": (categorical_sample, (torch.zeros(64, 10),)),
    "epsilon_greedy": (epsilon_greedy, (torch.zeros(64, 10), torch.ones(64))),
    "normal": (normal_sample, (torch.zeros(64, 3), torch.zeros(64, 3))),
    "tanh_normal": (lambda m, s: tanh_normal_sample(m, s)[0], (torch.zeros(64, 3), torch.zeros(64, 3))),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_vmap_randomness(name):
    sampler, args = SAMPLERS[name]
    torch.manual_seed(15)
    different = vmap(sampler, randomness="different")(*args)
    same = vmap(sampler, randomness="same")(*args)
    assert different.shape[0] == 64 and same.shape[0] == 64
    assert not bool((different == different[0]).all()), "rows should differ under randomness='different'"
    assert bool((same == same[0]).all()), "rows should agree under randomness='same'"


def test_vmap_log_prob_matches_batched_call():
    torch.manual_seed(16)
    logits, mean, log_std, u = torch.randn(5, 4), torch.randn(5, 2), torch.randn(5, 2), torch.randn(5, 2)
    action = torch.randint(0, 4, (5,))
    torch.testing.assert_close(vmap(categorical_log_prob)(logits, action), categorical_log_prob(logits, action))
    torch.testing.assert_close(
        vmap(tanh_normal_log_prob)(mean, log_std, u), tanh_normal_log_prob(mean, log_std, u)
    )


def categorical_bundle(logits, other_logits, action, epsilon):
    return (
        categorical_sample(logits),
        categorical_log_prob(logits, action),
        categorical_entropy(logits),
        categorical_kl(logits, other_logits),
        categorical_mode(logits),
        epsilon_greedy(logits, epsilon),
        epsilon_greedy_probs(logits, epsilon),
    )


def gaussian_bundle(mean, log_std, other_mean, other_log_std, x):
    action, log_prob = tanh_normal_sample(mean, log_std)
    return (
        normal_sample(mean, log_std),
        normal_log_prob(mean, log_std, x),
        normal_entropy(log_std),
        normal_kl(mean, log_std, other_mean, other_log_std),
        action,
        log_prob,
        tanh_normal_log_prob(mean, log_std, x),
        tanh_normal_mode(mean),
    )


@pytest.mark.parametrize(
    "bundle, make_args",
    [
        (categorical_bundle, lambda: (torch.randn(6, 5), torch.randn(6, 5), torch.randint(0, 5, (6,)), torch.rand(6))),
        (gaussian_bundle, lambda: tuple(torch.randn(6, 3) for _ in range(5))),
    ],
    ids=["categorical", "gaussian"],
)
def test_compile_fullgraph_equals_eager(bundle, make_args):
    torch.manual_seed(17)
    args = make_args()
    compiled = torch.compile(bundle, fullgraph=True)
    # fallback_random makes the compiled graph draw the same random numbers as eager
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(18)
        got = compiled(*args)
    torch.manual_seed(18)
    expected = bundle(*args)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
