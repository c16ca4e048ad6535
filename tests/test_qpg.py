"""Unit tests for fnrl.algos.qpg (DDPG, TD3, SAC, distributional critic).

Hand examples use zeroed output layers, so network outputs are known exactly; references
are torch.distributions (change of variables), separate critic calls and plain re-computation.
One function is compiled (TD3's update)."""
import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict
from torch.distributions import Independent, Normal, TanhTransform, TransformedDistribution

from fnrl import optim
from fnrl.algos import default_config, qpg
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets import call
from tests.helpers import leaves_only

OBS = 3


def make_spec(low=(-2.0, -1.0), high=(2.0, 3.0), discrete=False):
    if discrete:
        return EnvSpec("FakeDiscrete-v0", 1, (OBS,), torch.float32, (), torch.int64, num_actions=2)
    low, high = torch.tensor(low), torch.tensor(high)
    return EnvSpec("Fake-v0", 1, (OBS,), torch.float32, tuple(low.shape), torch.float32,
                   action_low=low, action_high=high)


def config(name, **kw):
    return dataclasses.replace(default_config(name), hidden=(16, 16), **kw)


def batch(n=6, spec=None, seed=0, reward=None, discount=None, weight=None):
    spec = spec or make_spec()
    g = torch.Generator().manual_seed(seed)
    lo, hi = spec.action_low, spec.action_high
    return TensorDict({
        "obs": torch.randn(n, OBS, generator=g),
        "next_obs": torch.randn(n, OBS, generator=g),
        "action": lo + (hi - lo) * torch.rand(n, len(lo), generator=g),
        "reward": torch.randn(n, generator=g) if reward is None else torch.tensor(reward),
        "discount": torch.full((n,), 0.99) if discount is None else torch.tensor(discount),
        "weight": torch.ones(n) if weight is None else torch.tensor(weight),
    }, batch_size=[n])


def zero_output_layers(state, actor_bias=0.0):
    """Zero the last linear layer of actor and critics (outputs = bias; critic bias 0)."""
    params = state["params"].clone()
    for group in ("actor", "critic"):
        leaves = [k for k in params[group].keys(include_nested=True, leaves_only=True)]
        last_w, last_b = sorted(k for k in leaves if k[-1] == "weight")[-1], sorted(k for k in leaves if k[-1] == "bias")[-1]
        params[group][last_w] = torch.zeros_like(params[group][last_w])
        params[group][last_b] = torch.full_like(params[group][last_b], actor_bias if group == "actor" else 0.0)
    state = state.clone()
    state["params"] = params
    state["target"] = params.select(*state["target"].keys()).clone()
    return state


def assert_td_equal(a, b):
    for k in a.keys(include_nested=True, leaves_only=True):
        assert torch.equal(a[k], b[k]), k


def assert_td_close(a, b, **tol):
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for k in a.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(a[k], b[k], **tol, msg=lambda m: f"{k}: {m}")


def assert_td_differs(a, b):
    assert any(not torch.equal(a[k], b[k]) for k in a.keys(include_nested=True, leaves_only=True))


# ---------------------------------------------------------------------------
# policy: tanh-Gaussian log-prob, action rescaling, warm-up, exploration noise
# ---------------------------------------------------------------------------


def test_sac_policy_log_prob_is_change_of_variables():
    spec = make_spec()
    nets = qpg.networks(config("sac"), spec)
    params = nets.init(3)["actor"].double()
    obs = torch.randn(512, OBS, dtype=torch.float64)
    torch.manual_seed(0)
    action, logp = nets.sample(params, obs)
    mean, raw = call(nets.actor, params, obs).chunk(2, dim=-1)
    log_std = qpg.LOG_STD_MIN + 0.5 * (qpg.LOG_STD_MAX - qpg.LOG_STD_MIN) * (torch.tanh(raw) + 1)
    # reference: p_A(a) = p_U(atanh a) / prod_d (1 - a_d^2)
    base = Independent(Normal(mean, log_std.exp()), 1)
    u = torch.atanh(action)
    reference = base.log_prob(u) - torch.log1p(-action.square()).sum(-1)
    torch.testing.assert_close(logp, reference, rtol=1e-6, atol=1e-6)
    squashed = TransformedDistribution(base, [TanhTransform()])
    torch.testing.assert_close(logp, squashed.log_prob(action), rtol=1e-6, atol=1e-6)
    assert (action.abs() < 1).all()


def test_sac_log_std_range():
    raw = torch.tensor([-1e3, 0.0, 1e3])
    torch.testing.assert_close(qpg._log_std(raw), torch.tensor([-5.0, -1.5, 2.0]))


def test_sde_policy_log_prob_is_change_of_variables_with_the_state_dependent_std():
    spec = make_spec()
    nets = qpg.networks(config("sac", use_sde=True, sde_log_std_init=-1.0), spec)
    params = nets.init(3)["actor"].double()
    assert params["log_std"].shape == (16, 2) and bool((params["log_std"] == -1.0).all())
    obs = torch.randn(512, OBS, dtype=torch.float64)
    torch.manual_seed(0)
    action, logp = nets.sample(params, obs)
    mean, z = call(nets.actor, params, obs)
    std = (z.square() @ (2 * params["log_std"]).exp() + 1e-6).sqrt()   # sigma_d(s)^2 = sum_l z_l^2 exp(log_std_ld)^2
    squashed = TransformedDistribution(Independent(Normal(mean, std), 1), [TanhTransform()])
    torch.testing.assert_close(logp, squashed.log_prob(action), rtol=1e-6, atol=1e-6)
    assert bool((mean.abs() <= 2.0).all())


def test_sde_exploration_is_a_function_of_the_state_until_the_next_update():
    spec = make_spec()
    agent = qpg.make(config("sac", use_sde=True, learning_starts=0, num_envs=4), spec)
    state = agent.init(0)
    assert state["sde_noise"].shape == (4, 16, 2)
    obs = torch.randn(4, OBS)
    first, _, _ = agent.act(state, obs, None)
    again, _, _ = agent.act(state, obs, None)
    torch.testing.assert_close(first, again)   # the same state and matrices: the same actions
    params = state["params"]["actor"]
    mean, z = call(qpg.networks(config("sac", use_sde=True), spec).actor, params, obs)
    by_hand = torch.tanh(mean + torch.einsum("nl,nld->nd", z, params["log_std"].exp() * state["sde_noise"]))
    to_env, _ = qpg._action_transforms(config("sac"), spec)
    torch.testing.assert_close(first, to_env(by_hand))
    two, _, _ = agent.act(state, obs[:2], None)   # a sub-batch of envs takes the first matrices
    torch.testing.assert_close(two, first[:2])
    new_state, _ = agent.update(state, batch(8, spec))
    assert not torch.equal(new_state["sde_noise"], state["sde_noise"])
    assert not torch.equal(agent.act(new_state, obs, None)[0], first)
    greedy, _, _ = agent.act(state, obs, None, explore=False)
    torch.testing.assert_close(greedy, to_env(torch.tanh(mean)))


def test_sde_first_matrices_depend_on_the_seed_alone():
    agent = qpg.make(config("sac", use_sde=True), make_spec())
    assert torch.equal(agent.init(0)["sde_noise"], agent.init(0)["sde_noise"])
    assert not torch.equal(agent.init(0)["sde_noise"], agent.init(1)["sde_noise"])


@pytest.mark.parametrize("name", ["ddpg", "td3", "sac"])
def test_greedy_action_is_rescaled_to_env_bounds(name):
    # output bias atanh(0.5) -> unit action 0.5; bounds [-2, 2] and [-1, 3]: center (0, 1), half (2, 2)
    spec = make_spec()
    agent = qpg.make(config(name), spec)
    state = zero_output_layers(agent.init(0), actor_bias=math.atanh(0.5))
    action, extras, carry = agent.act(state, torch.randn(4, OBS), "carry", explore=False)
    torch.testing.assert_close(action, torch.tensor([[1.0, 2.0]]).expand(4, 2))
    assert extras == {} and carry == "carry"


@pytest.mark.parametrize("name", ["ddpg", "sac"])
def test_warmup_actions_are_uniform_over_bounds(name):
    spec = make_spec()
    agent = qpg.make(config(name, learning_starts=100), spec)
    state = zero_output_layers(agent.init(0), actor_bias=math.atanh(0.9))
    torch.manual_seed(0)
    action, _, _ = agent.act(state, torch.randn(20_000, OBS), None, explore=True)
    low, high = spec.action_low, spec.action_high
    assert (action >= low).all() and (action <= high).all()
    torch.testing.assert_close(action.mean(0), (low + high) / 2, atol=0.05, rtol=0)
    torch.testing.assert_close(action.var(0), (high - low) ** 2 / 12, atol=0.05, rtol=0)
    # past learning_starts the policy acts: centred on the mode 0.9 (env units 1.8 and 2.8)
    state["env_steps"] = torch.tensor(100)
    action, _, _ = agent.act(state, torch.randn(20_000, OBS), None, explore=True)
    assert (action >= low).all() and (action <= high).all()
    if name == "ddpg":
        # a = clip(0.9 + 0.1 e, -1, 1): the unclipped side is Gaussian with std 0.1 (in half-range units)
        unit = (action - (low + high) / 2) / ((high - low) / 2)
        below = unit[unit < 1.0]
        assert abs((unit >= 1.0).float().mean().item() - 0.1587) < 0.01  # P(e >= 1)
        assert below.min() > 0.4 and below.max() < 1.0


def test_action_scale_for_unbounded_actions():
    spec = make_spec(low=(-math.inf, -math.inf), high=(math.inf, math.inf))
    with pytest.raises(ConfigError, match="--action-scale"):
        qpg.make(config("sac"), spec)
    agent = qpg.make(config("sac", action_scale=3.0), spec)
    state = zero_output_layers(agent.init(0), actor_bias=math.atanh(0.5))
    action, _, _ = agent.act(state, torch.randn(2, OBS), None, explore=False)
    torch.testing.assert_close(action, torch.full((2, 2), 1.5))


# ---------------------------------------------------------------------------
# critics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distributional", [False, True])
def test_vmapped_twin_critics_equal_separate_calls(distributional):
    spec = make_spec()
    nets = qpg.networks(config("td3", distributional=distributional, num_atoms=5), spec)
    params = nets.init(0)["critic"]
    assert params.batch_size == torch.Size([2])
    obs, action = torch.randn(7, OBS), torch.rand(7, 2) * 2 - 1
    q = nets.critics(params, obs, action)
    separate = torch.stack([call(nets.critic, params[k], obs, action) for k in range(2)])
    assert q.shape == ((2, 7, 5) if distributional else (2, 7))
    torch.testing.assert_close(q, separate, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(q[0], q[1])  # two independently initialised critics


@pytest.mark.parametrize("name", ["ddpg", "td3", "sac"])
def test_critic_loss_hand_example_terminal(name):
    # zero critics, discount 0: y = scale * r, loss = mean_i w_i * K * (y_i)^2 / 2, priority |y|
    # r = (1, 2), scale 0.5, w = (1, 0.5) -> K * (0.125, 0.25) -> K * 0.1875
    spec = make_spec()
    agent = qpg.make(config(name, reward_scale=0.5, prioritized=True), spec)
    state = zero_output_layers(agent.init(0))
    b = batch(2, spec, reward=[1.0, 2.0], discount=[0.0, 0.0], weight=[1.0, 0.5])
    _, m = agent.update(state, b)
    k = 1 if name == "ddpg" else 2
    torch.testing.assert_close(m["loss/critic"], torch.tensor(k * 0.1875))
    torch.testing.assert_close(m["priority"], torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(m["q_mean"], torch.tensor(0.0))


def test_critic_target_bootstraps_with_the_replay_discount():
    # zero critics but a nonzero critic bias c on the *target* only: y = r + d * c
    spec = make_spec()
    agent = qpg.make(config("td3", policy_noise=0.0), spec)
    state = zero_output_layers(agent.init(0))
    last_bias = sorted(k for k in state["target"]["critic"].keys(include_nested=True, leaves_only=True)
                       if k[-1] == "bias")[-1]
    state["target"]["critic"][last_bias] = torch.full((2, 1), 3.0)
    b = batch(3, spec, reward=[1.0, 0.0, -1.0], discount=[0.0, 0.5, 0.99 ** 3])
    _, m = agent.update(state, b)
    y = torch.tensor([1.0, 1.5, -1.0 + 3 * 0.99 ** 3])
    torch.testing.assert_close(m["loss/critic"], (y.square()).mean())  # K=2 times y^2/2


def test_distributional_critic_hand_example():
    # zero logits: uniform prediction over M atoms; terminal target is a point mass,
    # so the cross-entropy is log M for each critic: loss = K log M
    spec = make_spec()
    agent = qpg.make(config("td3", distributional=True, num_atoms=11, v_min=-5.0, v_max=5.0), spec)
    state = zero_output_layers(agent.init(0))
    b = batch(2, spec, reward=[1.0, 2.5], discount=[0.0, 0.0])
    _, m = agent.update(state, b)
    torch.testing.assert_close(m["loss/critic"], torch.tensor(2 * math.log(11)))
    torch.testing.assert_close(m["q_mean"], torch.tensor(0.0), atol=1e-6, rtol=0)


def test_lowest_mean_selection():
    support = torch.tensor([0.0, 1.0])
    logits = torch.log(torch.tensor([[[0.2, 0.8], [0.9, 0.1]], [[0.6, 0.4], [0.3, 0.7]]]))  # [K=2, N=2, M=2]
    torch.testing.assert_close(qpg._select_lowest_mean(logits, support), torch.tensor([[0.6, 0.4], [0.9, 0.1]]))


def test_group_learning_rates_hand_example():
    grads = TensorDict({"actor": {"w": torch.tensor([1.0, -2.0])}, "log_alpha": torch.tensor([4.0])}, [])
    tx = qpg.scale_by_group_learning_rate({"actor": 0.1, "log_alpha": 0.5})
    out, _ = tx.update(grads, tx.init(grads))
    torch.testing.assert_close(out["actor", "w"], torch.tensor([-0.1, 0.2]))
    torch.testing.assert_close(out["log_alpha"], torch.tensor([-2.0]))


def test_one_adam_with_group_rates_equals_separate_adams():
    g = torch.Generator().manual_seed(0)
    params = TensorDict({"actor": {"w": torch.randn(3, generator=g, dtype=torch.float64)},
                         "critic": {"w": torch.randn(2, 2, generator=g, dtype=torch.float64)}}, [])
    rates = {"actor": 3e-4, "critic": 1e-3}
    joint = optim.chain(optim.scale_by_adam(), qpg.scale_by_group_learning_rate(rates))
    separate = {k: optim.adam(r) for k, r in rates.items()}
    p_joint, s_joint = params.clone(), joint.init(params)
    p_sep = params.clone()
    s_sep = {k: separate[k].init(params[k]) for k in rates}
    for _ in range(3):
        grads = params.apply(lambda x: torch.randn(x.shape, generator=g, dtype=x.dtype))
        u, s_joint = joint.update(grads, s_joint, p_joint)
        p_joint = optim.apply_updates(p_joint, u)
        for k in rates:
            u, s_sep[k] = separate[k].update(grads[k], s_sep[k], p_sep[k])
            p_sep[k] = optim.apply_updates(p_sep[k], u)
    assert_td_close(p_joint, p_sep, rtol=1e-12, atol=1e-12)


def test_gradient_steps_on_leaves_with_stacked_critics_equal_the_tensordict_steps():
    """SAC's parameters (stacked critics [2], a 0-d log temperature) have a `Layout`, and Adam with
    group rates has `update_leaves`: plain eager `gradient_step`s on the leaves (the TensorDict
    update refuses to run) end on the same parameters and state, bit for bit, as the TensorDict
    update, with the same structure."""
    from fnrl.algos.common import gradient_step

    g = torch.Generator().manual_seed(0)
    critic = torch.stack([TensorDict({"w": torch.randn(3, 2, generator=g), "b": torch.randn(2, generator=g)}, [])
                          for _ in range(2)])
    params = TensorDict({"actor": {"w": torch.randn(3, 2, generator=g)}, "critic": critic,
                         "log_alpha": torch.zeros(())}, [])
    layout = optim.Layout.of(params)
    assert layout is not None and layout.tree(layout.leaves(params)).batch_size == ()
    assert layout.tree(layout.leaves(params))["critic"].batch_size == (2,)
    tx = optim.chain(optim.scale_by_adam(), qpg.scale_by_group_learning_rate({"actor": 3e-4, "critic": 1e-3,
                                                                             "log_alpha": 3e-4}))
    plain = optim.GradientTransformation(tx.init, tx.update)
    xs = [torch.randn(5, 3, generator=g) for _ in range(3)]

    def loss(p, x):
        q = torch.einsum("ni,kio->kno", x, p["critic", "w"]) + p["critic", "b"][:, None]
        return (x @ p["actor", "w"]).square().mean() + q.tanh().mean() + p["log_alpha"].exp(), {}

    results = []
    for opt in (leaves_only(tx), plain):   # the first steps on the leaves: its TensorDict update refuses
        p, state = params.clone(), opt.init(params)
        for x in xs:
            p, state, _ = gradient_step(loss, p, opt, state, x)
        results.append((p, state))
    (p_leaves, s_leaves), (p_tree, s_tree) = results
    assert (p_leaves == p_tree).all() and (s_leaves == s_tree).all()
    assert p_leaves["critic"].batch_size == p_tree["critic"].batch_size == (2,)
    assert list(p_leaves.keys(True, True)) == list(p_tree.keys(True, True))


# ---------------------------------------------------------------------------
# update: delays, targets, temperature, normalization
# ---------------------------------------------------------------------------


def test_td3_delayed_update_skips_actor_and_targets():
    spec = make_spec()
    agent = qpg.make(config("td3"), spec)
    state = agent.init(0)
    state["updates"] = torch.tensor(1)  # off step of policy_delay = 2
    new, _ = agent.update(state, batch(8, spec))
    assert_td_equal(new["params"]["actor"], state["params"]["actor"])
    assert_td_equal(new["target"], state["target"])
    for moment in ("exp_avg", "exp_avg_sq"):
        assert_td_equal(new["opt_state"]["0", moment, "actor"], state["opt_state"]["0", moment, "actor"])
    assert_td_differs(new["params"]["critic"], state["params"]["critic"])
    assert new["updates"].item() == 2
    # on step: everything moves, the targets by exactly one polyak step
    new2, _ = agent.update(new, batch(8, spec, seed=1))
    assert_td_differs(new2["params"]["actor"], new["params"]["actor"])
    expected = optim.polyak(new["target"], new2["params"].select("actor", "critic"), qpg.Config().tau)
    assert_td_equal(new2["target"], expected)


def test_delayed_sac_off_step_moves_only_the_critics_and_reports_the_last_actor_metrics():
    spec = make_spec()
    agent = qpg.make(config("sac", policy_delay=2), spec)
    state = agent.init(0)
    on_state, m_on = agent.update(state, batch(8, spec))           # updates 0: on the cadence
    off_state, m_off = agent.update(on_state, batch(8, spec, seed=1))   # updates 1: off it
    for group in ("actor", "log_alpha"):
        assert_td_differs(on_state["params"].select(group), state["params"].select(group))
        assert_td_equal(off_state["params"].select(group), on_state["params"].select(group))
    assert_td_differs(off_state["params"]["critic"], on_state["params"]["critic"])
    for k in ("loss/actor", "entropy", "loss/alpha"):
        assert m_off[k] == m_on[k]
    assert m_off["loss/critic"] != m_on["loss/critic"]


@pytest.mark.parametrize("name", ["ddpg", "sac"])
def test_every_update_moves_actor_and_targets_without_delay(name):
    spec = make_spec()
    agent = qpg.make(config(name), spec)
    state = agent.init(0)
    state["updates"] = torch.tensor(1)
    new, _ = agent.update(state, batch(8, spec))
    assert_td_differs(new["params"]["actor"], state["params"]["actor"])
    keys = ("critic",) if name == "sac" else ("actor", "critic")
    assert tuple(sorted(new["target"].keys())) == keys
    assert_td_close(new["target"], optim.polyak(state["target"], new["params"].select(*keys), qpg.Config().tau))


def test_sac_temperature_first_step_and_fixed_alpha():
    # a very high target entropy: the loss gradient on log alpha is negative, and Adam's
    # first step is lr * g / |g|: log alpha rises by alpha_lr
    spec = make_spec()
    agent = qpg.make(config("sac", target_entropy=50.0, alpha_init=0.5, alpha_lr=0.01), spec)
    state = agent.init(0)
    new, m = agent.update(state, batch(8, spec))
    torch.testing.assert_close(new["params"]["log_alpha"], torch.tensor([math.log(0.5) + 0.01]))
    torch.testing.assert_close(m["alpha"], torch.tensor(0.5))
    # with target entropy -|A| = -2 the default target is used
    fixed = qpg.make(config("sac", autotune=False, alpha=0.05), spec)
    state = fixed.init(0)
    assert "log_alpha" not in state["params"].keys()
    _, m = fixed.update(state, batch(8, spec))
    torch.testing.assert_close(m["alpha"], torch.tensor(0.05))
    assert "loss/alpha" not in m.keys()


def test_observation_normalization_statistics_in_state():
    spec = make_spec()
    agent = qpg.make(config("sac", normalize_obs=True), spec)
    state = agent.init(0)
    b = batch(64, spec)
    b["obs"] = b["obs"] * 10 + 5
    new, _ = agent.update(state, b)
    torch.testing.assert_close(new["obs_rms"]["mean"], b["obs"].mean(0), rtol=1e-4, atol=1e-3)
    # act normalizes with the state's statistics: shifting both obs and mean leaves the mode unchanged
    obs = torch.randn(4, OBS)
    shifted = new.clone()
    shifted["obs_rms"]["mean"] = new["obs_rms"]["mean"] + 1.0
    a1, _, _ = agent.act(new, obs, None, explore=False)
    a2, _, _ = agent.act(shifted, obs + 1.0, None, explore=False)
    torch.testing.assert_close(a1, a2)


def test_replayed_actions_are_mapped_back_to_unit_range():
    # the critic sees actions in [-1, 1]: an action at the env's upper bound is +1
    spec = make_spec()
    agent = qpg.make(config("ddpg"), spec)
    nets = qpg.networks(config("ddpg"), spec)
    state = agent.init(0)
    b = batch(2, spec, discount=[0.0, 0.0], reward=[0.0, 0.0])
    b["action"] = torch.stack([spec.action_high, spec.action_low])
    _, m = agent.update(state, b)
    q = call(nets.critic, state["params"]["critic"][0], b["obs"], torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    torch.testing.assert_close(m["loss/critic"], (0.5 * q.square()).mean())


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ddpg", "td3", "sac"])
def test_discrete_env_is_a_config_error(name):
    with pytest.raises(ConfigError, match="continuous action space"):
        qpg.make(config(name), make_spec(discrete=True))


@pytest.mark.parametrize("overrides, match", [
    ({"algo": "a2c"}, "--algo"),
    ({"algo": "sac", "distributional": True}, "not sac"),
    ({"algo": "td3", "use_sde": True}, "--use-sde is for sac"),
    ({"algo": "td3", "distributional": True, "v_min": 1.0, "v_max": 1.0}, "v-min"),
    ({"tau": 0.0}, "--tau"),
    ({"policy_delay": 0}, "--policy-delay"),
    ({"batch_size": 0}, "--batch-size"),
])
def test_bad_settings_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        qpg.validate(dataclasses.replace(qpg.Config(), **overrides))


def test_variants():
    assert default_config("ddpg").algo == "ddpg" and default_config("ddpg").num_critics == 1
    assert default_config("td3").policy_delay == 2 and default_config("td3").num_critics == 2
    assert default_config("sac").algo == "sac" and qpg.SPEC.kind == "off_policy"


# ---------------------------------------------------------------------------
# compile: one function
# ---------------------------------------------------------------------------


def two_updates_eager_and_compiled(agent, spec):
    """Two updates from agent.init(0), eager and compiled (the second without a recompile), with
    the same random draws: ((state 1, state 2, metrics 2) eager, the same compiled)."""
    state = agent.init(0)
    b1, b2 = batch(16, spec, seed=1), batch(16, spec, seed=2)
    compiled = torch.compile(agent.update, fullgraph=True)
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(5)
        eager_1, _ = agent.update(state, b1)
        eager_2, m_eager = agent.update(eager_1, b2)
        torch.manual_seed(5)
        comp_1, _ = compiled(state, b1)
        with torch._dynamo.config.patch(error_on_recompile=True):
            comp_2, m_comp = compiled(comp_1, b2)
    return (eager_1, eager_2, m_eager), (comp_1, comp_2, m_comp)


def test_compiled_sde_sac_update_equals_eager_and_does_not_recompile():
    spec = make_spec()
    eager, comp = two_updates_eager_and_compiled(qpg.make(config("sac", use_sde=True, num_envs=2), spec), spec)
    for c, e in zip(comp, eager):
        assert_td_close(c, e, rtol=1e-5, atol=1e-6)


def test_compiled_td3_update_equals_eager_and_does_not_recompile():
    spec = make_spec()
    eager, comp = two_updates_eager_and_compiled(qpg.make(config("td3"), spec), spec)   # the 2nd: the delay's off step
    for c, e in zip(comp, eager):
        assert_td_close(c, e, rtol=1e-5, atol=1e-6)
    assert_td_equal(comp[1]["params"]["actor"], comp[0]["params"]["actor"])
