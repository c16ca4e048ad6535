"""Tests for fnrl.algos.dqn and fnrl.nets.q: epsilon schedules (incl. rlpyt's per-env final
epsilons), act, the target update, each head's loss against a plain-loop reference, double-Q
action selection, losses falling on a fixed batch, validation errors, and one compiled update."""
import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

from fnrl.algos import dqn
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets import call
from fnrl.nets.q import QNetwork, cosine_embedding, scale_gradient

OBS, A, N = 3, 4, 16
SPEC = EnvSpec("Toy-v0", 2, (OBS,), torch.float32, (), torch.int64, num_actions=A)
CONTINUOUS = EnvSpec("Pendulum-v1", 1, (3,), torch.float32, (1,), torch.float32,
                     action_low=torch.tensor([-2.0]), action_high=torch.tensor([2.0]))
SMALL = dict(hidden=(16,), num_envs=2, batch_size=N, buffer_size=1000, learning_starts=0)


def config(variant: str = "dqn", **overrides) -> dqn.Config:
    return dataclasses.replace(dqn.Config(), **{**dqn.VARIANTS[variant], **SMALL, **overrides})


def make_batch(seed: int = 0, n: int = N, terminal_every: int = 5) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    discount = torch.full((n,), 0.9)
    discount[::terminal_every] = 0.0
    return TensorDict({
        "obs": torch.randn(n, OBS, generator=g),
        "action": torch.randint(0, A, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "discount": discount,
        "next_obs": torch.randn(n, OBS, generator=g),
        "weight": torch.rand(n, generator=g) + 0.5,
        "index": torch.arange(n),
    }, batch_size=[n])


def distinct_params(cfg):
    """Online and target parameters from two different initialisations."""
    online = dqn.make(cfg, SPEC).init(0)["params"]
    target = dqn.make(cfg, SPEC).init(1)["params"]
    return online, target


def flat(td: TensorDict) -> dict:
    return td.flatten_keys(".").to_dict()


# ---------------------------------------------------------------------------
# exploration
# ---------------------------------------------------------------------------


def test_epsilon_schedule_hand_values():
    cfg = config(learning_starts=100, eps_steps=1100, eps_init=1.0, eps_final=0.1)
    for t, expected in [(0, 1.0), (100, 1.0), (600, 0.55), (1100, 0.1), (5000, 0.1)]:
        eps = dqn.epsilon(cfg, torch.tensor(t), 3)
        torch.testing.assert_close(eps, torch.full((3,), expected))


def test_per_env_final_epsilons_are_log_spaced():
    cfg = config(eps_final=0.1, eps_final_min=0.001)
    torch.testing.assert_close(dqn.final_epsilons(cfg, 3), torch.tensor([0.001, 0.01, 0.1]))
    torch.testing.assert_close(dqn.final_epsilons(config(eps_final=0.1), 3), torch.full((3,), 0.1))
    # halfway along the ramp every env is halfway between eps_init and its own final epsilon
    cfg = config(learning_starts=0, eps_steps=1000, eps_init=1.0, eps_final=0.1, eps_final_min=0.001)
    torch.testing.assert_close(dqn.epsilon(cfg, torch.tensor(500), 3),
                               torch.tensor([1.001, 1.01, 1.1]) / 2)


def _non_greedy_fraction(cfg, env_steps: int, explore: bool, num_envs: int, draws: int = 4000):
    agent = dqn.make(cfg, SPEC)
    state = agent.init(0)
    state["env_steps"] = torch.tensor(env_steps)
    obs = torch.randn(num_envs, OBS)
    greedy = agent.act(state, obs, None, explore=False)[0] if cfg.eps_eval == 0 else \
        dqn.functions(cfg, SPEC).q_values(state["params"], obs).argmax(-1)
    torch.manual_seed(0)
    actions = torch.stack([agent.act(state, obs, None, explore)[0] for _ in range(draws)])
    return (actions != greedy).float().mean(0), actions


def test_act_shapes_and_greedy_evaluation():
    cfg = config()
    agent = dqn.make(cfg, SPEC)
    state = agent.init(0)
    obs = torch.randn(5, OBS)
    action, extras, carry = agent.act(state, obs, "carry", explore=True)
    assert action.shape == (5,) and action.dtype == torch.int64 and extras == {} and carry == "carry"
    assert ((action >= 0) & (action < A)).all()
    greedy, _, _ = agent.act(state, obs, None, explore=False)
    torch.testing.assert_close(greedy, dqn.functions(cfg, SPEC).q_values(state["params"], obs).argmax(-1))


def test_epsilon_greedy_frequencies_per_env():
    # after the ramp: env b takes a non-greedy action with probability eps_b (A - 1) / A
    cfg = config(learning_starts=0, eps_steps=10, eps_final=0.8, eps_final_min=0.05)
    frac, _ = _non_greedy_fraction(cfg, 1000, True, 3)
    expected = dqn.final_epsilons(cfg, 3) * (A - 1) / A
    torch.testing.assert_close(frac, expected, atol=0.03, rtol=0)
    # before learning starts every action is uniform
    frac, actions = _non_greedy_fraction(config(learning_starts=500), 0, True, 2)
    torch.testing.assert_close(frac, torch.full((2,), (A - 1) / A), atol=0.03, rtol=0)
    counts = torch.bincount(actions.flatten(), minlength=A).float() / actions.numel()
    torch.testing.assert_close(counts, torch.full((A,), 1 / A), atol=0.02, rtol=0)
    # evaluation uses eps_eval, whatever the schedule says
    frac, _ = _non_greedy_fraction(config(eps_eval=0.4), 0, False, 2)
    torch.testing.assert_close(frac, torch.full((2,), 0.4 * (A - 1) / A), atol=0.03, rtol=0)


# ---------------------------------------------------------------------------
# network
# ---------------------------------------------------------------------------


def test_cosine_embedding_and_gradient_scaling_hand_values():
    torch.testing.assert_close(cosine_embedding(torch.tensor([0.5, 0.0]), 3),
                               torch.tensor([[1.0, 0.0, -1.0], [1.0, 1.0, 1.0]]), atol=1e-6, rtol=0)
    x = torch.tensor([2.0, -3.0], requires_grad=True)
    y = scale_gradient(x, 0.25)
    y.sum().backward()
    torch.testing.assert_close(y, x.detach())
    torch.testing.assert_close(x.grad, torch.tensor([0.25, 0.25]))


@pytest.mark.parametrize("head,k", [("q", 1), ("categorical", 7), ("quantile", 5)])
def test_network_shapes_and_dueling_identity(head, k):
    net = QNetwork((OBS,), A, head, k, dueling=True, hidden=(8, 8))
    obs = torch.randn(2, 5, OBS)
    out = net(obs)
    assert out.shape == (2, 5, A, k)
    # V + A - mean_a A: the mean over actions is the value stream
    h = net.torso(obs)
    torch.testing.assert_close(out.mean(-2), net.value(h))


def test_iqn_network_shapes():
    net = QNetwork((OBS,), A, "iqn", 1, hidden=(8,), cosine_dim=6)
    out = net(torch.randn(5, OBS), torch.rand(5, 9))
    assert out.shape == (5, A, 9)


def test_iqn_q_values_at_midpoint_fractions():
    """IQN's Q for choosing actions: the mean over the K midpoints (k + 1/2) / K by default, so the
    greedy policy is deterministic; "sampled" draws K fresh fractions at every call."""
    cfg = config("iqn", num_quantile_samples=4)
    fns = dqn.functions(cfg, SPEC)
    params = dqn.make(cfg, SPEC).init(0)["params"]
    obs = torch.randn(5, OBS)
    taus = torch.tensor([0.125, 0.375, 0.625, 0.875]).expand(5, 4)
    torch.testing.assert_close(fns.q_values(params, obs), fns.outputs(params, obs, taus).mean(-1))
    torch.testing.assert_close(fns.q_values(params, obs), fns.q_values(params, obs))
    sampled = dqn.functions(dataclasses.replace(cfg, act_fractions="sampled"), SPEC)
    assert not torch.equal(sampled.q_values(params, obs), sampled.q_values(params, obs))
    with pytest.raises(ConfigError, match="act-fractions"):
        dqn.validate(dataclasses.replace(cfg, act_fractions="random"))


# ---------------------------------------------------------------------------
# losses against plain-loop references (float64)
# ---------------------------------------------------------------------------


def _reference_inputs(cfg, seed=0):
    fns = dqn.functions(cfg, SPEC)
    online, target = distinct_params(cfg)
    online, target = online.double(), target.double()
    batch = make_batch(seed).apply(lambda x: x.double() if x.is_floating_point() else x)
    return fns, online, target, batch


@pytest.mark.parametrize("double_q", [False, True])
def test_q_head_td_matches_loop(double_q):
    cfg = config(double_q=double_q)
    fns, online, target, b = _reference_inputs(cfg)
    loss, metrics = fns.loss(online, target, b)
    q, q_next_t = call(fns.net, online, b["obs"])[..., 0], call(fns.net, target, b["next_obs"])[..., 0]
    q_next_o = call(fns.net, online, b["next_obs"])[..., 0]
    tds, per = [], []
    for i in range(N):
        a_star = int(q_next_o[i].argmax()) if double_q else int(q_next_t[i].argmax())
        td = float(b["reward"][i] + b["discount"][i] * q_next_t[i, a_star] - q[i, b["action"][i]])
        tds.append(abs(td))
        per.append(0.5 * td * td if abs(td) <= 1 else abs(td) - 0.5)
    torch.testing.assert_close(metrics["td_abs"], torch.tensor(tds, dtype=torch.float64))
    expected = sum(w * p for w, p in zip(b["weight"].tolist(), per)) / N
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))


def test_double_q_differs_exactly_where_online_and_target_argmax_differ():
    plain_cfg = config()
    fns, online, target, b = _reference_inputs(plain_cfg)
    _, plain = fns.loss(online, target, b)
    _, double = dqn.functions(config(double_q=True), SPEC).loss(online, target, b)
    online_argmax = call(fns.net, online, b["next_obs"])[..., 0].argmax(-1)
    target_argmax = call(fns.net, target, b["next_obs"])[..., 0].argmax(-1)
    differ = (online_argmax != target_argmax) & (b["discount"] > 0)
    assert differ.any() and (~differ).any()
    torch.testing.assert_close(plain["td_abs"][~differ], double["td_abs"][~differ])
    assert (plain["td_abs"][differ] != double["td_abs"][differ]).all()


def _c51_loop_target(z, next_probs, reward, discount):
    """Bellemare et al. (2017) Algorithm 1, written atom by atom."""
    v_min, v_max, m = z[0].item(), z[-1].item(), len(z)
    dz = (v_max - v_min) / (m - 1)
    out = [0.0] * m
    for j in range(m):
        tz = min(max(reward + discount * z[j].item(), v_min), v_max)
        pos = (tz - v_min) / dz
        low, up = math.floor(pos), math.ceil(pos)
        if low == up:
            out[low] += next_probs[j].item()
        else:
            out[low] += next_probs[j].item() * (up - pos)
            out[up] += next_probs[j].item() * (pos - low)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("double_q", [False, True])
def test_categorical_loss_and_kl_priority_match_loop(double_q):
    cfg = config("c51", num_atoms=11, v_min=-2.0, v_max=3.0, double_q=double_q)
    fns, online, target, b = _reference_inputs(cfg)
    loss, metrics = fns.loss(online, target, b)
    z = torch.linspace(-2.0, 3.0, 11, dtype=torch.float64)
    logits = call(fns.net, online, b["obs"])
    p_next_t = torch.softmax(call(fns.net, target, b["next_obs"]), -1)
    p_next_o = torch.softmax(call(fns.net, online, b["next_obs"]), -1)
    ce, kl = [], []
    for i in range(N):
        select = p_next_o[i] if double_q else p_next_t[i]
        a_star = int((select * z).sum(-1).argmax())
        m = _c51_loop_target(z, p_next_t[i, a_star], b["reward"][i].item(), b["discount"][i].item())
        log_p = torch.log_softmax(logits[i, b["action"][i]], -1)
        ce.append(float(-(m * log_p).sum()))
        kl.append(float(sum(mj * (math.log(mj) - lp) for mj, lp in zip(m.tolist(), log_p.tolist()) if mj > 0)))
    torch.testing.assert_close(metrics["td_abs"], torch.tensor(kl, dtype=torch.float64))
    expected = sum(w * c for w, c in zip(b["weight"].tolist(), ce)) / N
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))


def test_quantile_loss_matches_loop():
    k = 5
    cfg = config("qrdqn", num_quantiles=k, huber_delta=1.0)
    fns, online, target, b = _reference_inputs(cfg)
    loss, metrics = fns.loss(online, target, b)
    theta = call(fns.net, online, b["obs"])
    theta_next = call(fns.net, target, b["next_obs"])
    taus = [(2 * i + 1) / (2 * k) for i in range(k)]
    per, td_abs = [], []
    for n in range(N):
        a_star = int(theta_next[n].mean(-1).argmax())
        target_q = [b["reward"][n].item() + b["discount"][n].item() * theta_next[n, a_star, j].item() for j in range(k)]
        pred = theta[n, b["action"][n]].tolist()
        total, abs_sum = 0.0, 0.0
        for i in range(k):
            for j in range(k):
                u = target_q[j] - pred[i]
                huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                total += abs(taus[i] - (u < 0)) * huber / k
                abs_sum += abs(u)
        per.append(total)
        td_abs.append(abs_sum / (k * k))
    torch.testing.assert_close(metrics["td_abs"], torch.tensor(td_abs, dtype=torch.float64))
    expected = sum(w * p for w, p in zip(b["weight"].tolist(), per)) / N
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))


def test_importance_weights_scale_the_loss():
    fns, online, target, b = _reference_inputs(config())
    loss, _ = fns.loss(online, target, b)
    doubled = b.clone()
    doubled["weight"] = b["weight"] * 2
    torch.testing.assert_close(fns.loss(online, target, doubled)[0], 2 * loss)


# ---------------------------------------------------------------------------
# update: target network, priorities, learning on a fixed batch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_target_update_happens_exactly_every_k_updates(tau):
    k = 3
    agent = dqn.make(config(target_update_interval=k, tau=tau), SPEC)
    state = agent.init(0)
    batch = make_batch()
    for i in range(1, 8):
        before = state["target_params"].clone()
        state, _ = agent.update(state, batch)
        assert state["updates"].item() == i
        expected = before.lerp(state["params"], tau) if i % k == 0 else before
        if tau == 1.0 and i % k == 0:
            expected = state["params"]
        torch.testing.assert_close(flat(state["target_params"]), flat(expected), rtol=0, atol=0)
        if i % k:  # the online network has moved on since the last target update
            assert not all(torch.equal(t, o) for t, o in zip(flat(state["target_params"]).values(),
                                                                flat(state["params"]).values()))


def test_priorities_only_with_prioritized_replay():
    batch = make_batch()
    _, m = dqn.make(config("rainbow"), SPEC).update(dqn.make(config("rainbow"), SPEC).init(0), batch)
    assert m["priority"].shape == (N,) and (m["priority"] >= 0).all()
    torch.testing.assert_close(m["priority"].mean(), m["td_abs_mean"])
    _, m = dqn.make(config(), SPEC).update(dqn.make(config(), SPEC).init(0), batch)
    assert "priority" not in m.keys()
    assert all(v.ndim == 0 for v in m.values())
    assert {"loss/q", "q_mean", "epsilon"} <= set(m.keys())


def agent_head(variant: str) -> str:
    return dqn.VARIANTS[variant].get("head", "q")


@pytest.mark.parametrize("variant", ["dqn", "c51", "rainbow", "qrdqn", "iqn"])
def test_loss_decreases_on_a_fixed_batch(variant):
    torch.manual_seed(0)
    agent = dqn.make(config(variant, learning_rate=3e-3, target_update_interval=10_000, hidden=(32,)), SPEC)
    state = agent.init(0)
    batch = make_batch()
    # the cross-entropy of C51 is bounded below by the target's entropy: follow its KL part
    key = "td_abs_mean" if agent_head(variant) == "categorical" else "loss/q"
    history = []
    for _ in range(60):
        state, m = agent.update(state, batch)
        history.append(m[key].item())
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    assert math.isfinite(last) and last < 0.7 * first, (first, last)


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,match", [
    (dict(buffer_size=8, batch_size=16), "smaller than one batch"),
    (dict(n_step=600, buffer_size=1000, num_envs=2), "n-step"),
    (dict(head="noisy"), "--head"),
    (dict(optimizer="sgd"), "--optimizer"),
    (dict(v_min=1.0, v_max=1.0, head="categorical"), "v-min"),
    (dict(eps_final_min=0.5, eps_final=0.1), "eps-final-min"),
    (dict(learning_rate=0.0), "learning-rate"),
])
def test_invalid_settings_raise_one_line_config_error(overrides, match):
    with pytest.raises(ConfigError, match=match) as info:
        dqn.validate(dataclasses.replace(dqn.Config(), **overrides))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("variant", ["dqn", "c51", "iqn"])
def test_continuous_env_is_refused(variant):
    with pytest.raises(ConfigError, match="needs a discrete action space.*sac") as info:
        dqn.make(config(variant), CONTINUOUS)
    assert "\n" not in str(info.value)


def test_variants_are_valid_configs():
    assert set(dqn.VARIANTS) == {"dqn", "c51", "rainbow", "qrdqn", "iqn"}
    for name in dqn.VARIANTS:
        dqn.validate(dataclasses.replace(dqn.Config(), **dqn.VARIANTS[name]), SPEC)
    assert dqn.SPEC.kind == "off_policy"


# ---------------------------------------------------------------------------
# one compiled update
# ---------------------------------------------------------------------------


def test_compiled_update_equals_eager_and_does_not_recompile():
    agent = dqn.make(config("rainbow", hidden=(16,), num_atoms=11, target_update_interval=2), SPEC)
    compiled = torch.compile(agent.update, fullgraph=True)
    eager_state = agent.init(0)
    compiled_state = eager_state.clone()
    for i in range(3):
        batch = make_batch(seed=i)
        eager_state, eager_m = agent.update(eager_state, batch)
        stance = "fail_on_recompile" if i > 0 else "default"
        with torch.compiler.set_stance(stance):
            compiled_state, compiled_m = compiled(compiled_state, batch)
        torch.testing.assert_close(flat(compiled_m), flat(eager_m), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(flat(compiled_state), flat(eager_state), rtol=1e-4, atol=1e-5)
