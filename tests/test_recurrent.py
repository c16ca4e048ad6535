"""Recurrent cores, the CartPoleNoVel env, the sampler's carry handling and recurrent PPO/A2C."""
import math

import pytest
import torch
from tensordict import TensorDict

from fnrl.nets import parameters
from fnrl.nets.recurrent import GRUCore, LSTMCore, reset_carry, step, unroll

CORES = {"lstm": (LSTMCore, torch.nn.LSTM), "gru": (GRUCore, torch.nn.GRU)}


def _core(kind, I=3, H=5, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    core = CORES[kind][0](I, H)
    params = parameters(core).apply(lambda p: (p + 0.1 * torch.randn_like(p)).to(dtype))  # non-zero biases
    return core, params


def _random_carry(core, B, dtype=torch.float64):
    return core.initial_carry([B], dtype=dtype).apply(lambda z: torch.randn_like(z))


# ----- hand-computed examples ------------------------------------------------------------

def test_zero_weights_hand_computed():
    # all weights and biases zero: every gate pre-activation is 0, so sigmoid = 1/2, tanh = 0
    # LSTM: c' = c/2, h' = tanh(c')/2.  GRU: n = 0, z = 1/2, h' = h/2.
    for kind in CORES:
        core = CORES[kind][0](1, 1)
        params = parameters(core).apply(torch.zeros_like)
        carry = core.initial_carry([1]).apply(torch.ones_like)
        reset = torch.tensor([[False], [False], [True]])
        y, out = unroll(core, params, torch.zeros(3, 1, 1), reset, carry)
        if kind == "lstm":
            # c: 1 -> .5 -> .25, reset -> 0;  h = tanh(c)/2
            assert y[:, 0, 0].tolist() == pytest.approx([0.5 * math.tanh(0.5), 0.5 * math.tanh(0.25), 0.0])
            assert out["c"].item() == 0.0
        else:
            # h: 1 -> .5 -> .25, reset -> 0 -> 0 (z h with h = 0)
            assert y[:, 0, 0].tolist() == pytest.approx([0.5, 0.25, 0.0])
        assert out["h"].item() == 0.0


def test_reset_carry_zeroes_selected_rows():
    carry = TensorDict({"h": torch.ones(3, 2), "c": torch.full((3, 2), 2.0)}, batch_size=[3])
    out = reset_carry(carry, torch.tensor([False, True, False]))
    assert out["h"].tolist() == [[1, 1], [0, 0], [1, 1]]
    assert out["c"].tolist() == [[2, 2], [0, 0], [2, 2]]
    assert carry["h"].sum() == 6  # input untouched


# ----- references --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(CORES))
def test_matches_torch_nn_step_for_step(kind):
    core, params = _core(kind)
    ref = CORES[kind][1](3, 5).double()
    with torch.no_grad():
        for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(ref, n + "_l0").copy_(params[n])
    T, B = 7, 4
    x = torch.randn(T, B, 3, dtype=torch.float64)
    carry = _random_carry(core, B)
    y, out = unroll(core, params, x, torch.zeros(T, B, dtype=torch.bool), carry)
    if kind == "lstm":
        y_ref, (h_ref, c_ref) = ref(x, (carry["h"][None], carry["c"][None]))
        torch.testing.assert_close(out["c"], c_ref[0])
    else:
        y_ref, h_ref = ref(x, carry["h"][None])
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(out["h"], h_ref[0])
    # step by step with `step` gives the same sequence
    c = carry
    for t in range(T):
        y_t, c = step(core, params, x[t], torch.zeros(B, dtype=torch.bool), c)
        torch.testing.assert_close(y_t, y_ref[t])


@pytest.mark.parametrize("kind", list(CORES))
def test_reset_inside_segment_equals_two_separate_unrolls(kind):
    """An unroll over [episode-1 end, episode-2 start] equals two unrolls, the second from zeros."""
    core, params = _core(kind)
    T, B = 9, 3
    x = torch.randn(T, B, 3, dtype=torch.float64)
    carry = _random_carry(core, B)
    starts = [4, 1, None]  # env 0: new episode at t=4; env 1 at t=1; env 2: none
    reset = torch.zeros(T, B, dtype=torch.bool)
    for b, s in enumerate(starts):
        if s is not None:
            reset[s, b] = True
    y, out = unroll(core, params, x, reset, carry)
    for b, s in enumerate(starts):
        one = carry[b:b + 1]
        no_reset = torch.zeros(T, 1, dtype=torch.bool)
        if s is None:
            y_ref, out_ref = unroll(core, params, x[:, b:b + 1], no_reset, one)
        else:
            y1, _ = unroll(core, params, x[:s, b:b + 1], no_reset[:s], one)
            y2, out_ref = unroll(core, params, x[s:, b:b + 1], no_reset[s:], core.initial_carry([1], dtype=x.dtype))
            y_ref = torch.cat([y1, y2])
        torch.testing.assert_close(y[:, b:b + 1], y_ref)
        torch.testing.assert_close(out[b:b + 1], out_ref)


def test_gradient_does_not_flow_across_a_reset():
    core, params = _core("lstm")
    x = torch.randn(6, 1, 3, dtype=torch.float64, requires_grad=True)
    reset = torch.zeros(6, 1, dtype=torch.bool)
    reset[3] = True
    y, _ = unroll(core, params, x, reset, core.initial_carry([1], dtype=x.dtype))
    (g,) = torch.autograd.grad(y[3:].sum(), x)
    assert g[:3].abs().max() == 0 and g[3:].abs().min() > 0


def test_compiled_and_vmapped_unroll_equal_eager():
    core, params = _core("lstm", dtype=torch.float32)
    T, B, S = 5, 4, 3
    x = torch.randn(T, B, 3)
    reset = torch.rand(T, B) < 0.3
    carry = _random_carry(core, B, torch.float32)

    def f(params, x, reset, carry):
        y, out = unroll(core, params, x, reset, carry)
        return y, out

    y, out = f(params, x, reset, carry)
    y_c, out_c = torch.compile(f, fullgraph=True)(params, x, reset, carry)
    torch.testing.assert_close(y_c, y)
    torch.testing.assert_close(out_c, out)
    # vmap over a leading axis of S parameter sets (e.g. seeds), shared inputs
    stacked = torch.stack([params] + [params.apply(lambda p: p + 0.01 * torch.randn_like(p)) for _ in range(S - 1)])
    y_v, out_v = torch.func.vmap(f, in_dims=(0, None, None, None))(stacked, x, reset, carry)
    assert y_v.shape == (S, T, B, 5)
    for s in range(S):
        y_s, out_s = f(stacked[s], x, reset, carry)
        torch.testing.assert_close(y_v[s], y_s)
        torch.testing.assert_close(out_v[s], out_s)


# ----- fnrl/CartPoleNoVel-v1 -----------------------------------------------------------------

def test_cartpole_novel_drops_the_velocities():
    from fnrl import envs

    full = envs.make("CartPole-v1", num_envs=2, seed=3)
    part = envs.make("fnrl/CartPoleNoVel-v1", num_envs=2, seed=3)
    assert part.spec.obs_shape == (2,) and part.spec.env_id == "fnrl/CartPoleNoVel-v1"
    assert part.spec.num_actions == 2 and part.spec.max_episode_steps == 500
    o_full, o_part = full.reset()["obs"], part.reset()["obs"]
    torch.testing.assert_close(o_part, o_full[:, [0, 2]])
    for t in range(30):
        a = torch.tensor([t % 2, (t // 3) % 2])
        s_full, s_part = full.step(a), part.step(a)
        torch.testing.assert_close(s_part["obs"], s_full["obs"][:, [0, 2]])
        for k in ("reward", "done", "valid", "episode_return"):
            assert torch.equal(s_part[k], s_full[k])
    assert envs.env_spec("fnrl/CartPoleNoVel-v1").obs_shape == (2,)
    full.close(), part.close()


# ----- sampler carry, recurrent PPO ---------------------------------------------------------

import dataclasses  # noqa: E402

from fnrl import envs  # noqa: E402
from fnrl.algos import ppo  # noqa: E402
from fnrl.errors import ConfigError  # noqa: E402
from fnrl.nets.recurrent import reset_carry as _reset  # noqa: E402
from fnrl.samplers import SerialSampler  # noqa: E402

RPPO = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", num_envs=4, num_steps=6, update_epochs=2, num_minibatches=2,
                  total_steps=10_000, core="lstm", core_size=8, hidden=(8,))


def _recurrent_ppo(config, env_id=None, num_envs=None, horizon=None, seed=0):
    env = envs.make(env_id or config.env_id, num_envs or config.num_envs, seed=seed,
                    backend="gymnasium" if (env_id or "").startswith("fnrltest") else "auto")
    agent = ppo.make(config, env.spec)
    state = agent.init(seed)
    return agent, state, SerialSampler(env, agent.act, horizon or config.num_steps)


def test_sampler_reset_mask_on_hand_built_episodes():
    # CountTerm: 3 steps then a terminal; the next step is the env's reset step (valid=False)
    agent, state, sampler = _recurrent_ppo(RPPO, "fnrltest/CountTerm-v0", num_envs=1, horizon=8)
    ro = sampler.collect(state).clone()
    assert ro["valid"][:, 0].tolist() == [True, True, True, False, True, True, True, False]
    # obs[t] is an episode's first observation where the previous step was a reset step
    assert ro["obs"][:, 0, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert ro["reset"][:, 0].tolist() == [True, False, False, False, True, False, False, False]
    ro2 = sampler.collect(state)
    assert ro2["reset"][:, 0].tolist() == [True, False, False, False, True, False, False, False]
    # the carry each step started from is zero exactly at episode starts
    # (zero biases and obs 0 keep it zero one step longer; from obs 1 on it is not)
    h = ro["carry", "actor", "h"][:, 0]
    assert (h[ro["reset"][:, 0]] == 0).all() and (h[[2, 3, 6, 7]] != 0).all()


def test_sampler_carry_is_kept_and_replays_exactly():
    agent, state, sampler = _recurrent_ppo(RPPO, num_envs=3, horizon=40)
    r1 = sampler.collect(state).clone()
    last = sampler.carry.clone()
    r2 = sampler.collect(state).clone()
    assert r1["reset"].any(), "some episode should end within 40 random steps"
    # across calls: the next segment starts from the kept carry (zeroed where an episode starts)
    torch.testing.assert_close(r2["carry"][0], _reset(last, r2["reset"][0]))
    # replaying from any stored carry with the stored resets reproduces the sampler's states and outputs
    from fnrl.algos.common import recurrent_actor_critic_policy

    rnn = recurrent_actor_critic_policy(sampler.env.spec, "lstm", 8, (8,))
    for t0 in (0, 17):
        d, _, _ = rnn.unroll(state["params"], r1["obs"][t0:], r1["reset"][t0:], r1["carry"][t0])
        logp = torch.log_softmax(d[0], -1).gather(-1, r1["action"][t0:, :, None]).squeeze(-1)
        torch.testing.assert_close(logp, r1["logp"][t0:])
    # the state a step starts from is the previous step's output, reset where an episode starts
    for t in range(1, 40):
        _, _, out = rnn.unroll(state["params"], r1["obs"][t - 1:t], r1["reset"][t - 1:t], r1["carry"][t - 1])
        torch.testing.assert_close(r1["carry"][t], _reset(out, r1["reset"][t]))


def test_feed_forward_rollouts_have_no_recurrent_keys():
    env = envs.make("CartPole-v1", 2, seed=0)
    agent = ppo.make(ppo.Config(num_envs=2), env.spec)
    ro = SerialSampler(env, agent.act, 4).collect(agent.init(0))
    assert "reset" not in ro.keys() and "carry" not in ro.keys()


def test_recurrent_minibatches_split_only_envs_and_invalid_steps_are_masked():
    agent, state, sampler = _recurrent_ppo(RPPO)
    ro = sampler.collect(state).clone()
    new_state, metrics = agent.update(state, ro)
    assert all(torch.isfinite(v) for v in metrics.values())
    ro2 = ro.clone()
    ro2["valid"][3] = False
    ro2["done"][2] = True
    ro3 = ro2.clone()
    ro3["reward"][3] = 1e6
    ro3["action"][3] = 1 - ro3["action"][3]
    ro3["logp"][3] = -50.0
    torch.manual_seed(1)
    s2, _ = agent.update(state, ro2)
    torch.manual_seed(1)
    s3, _ = agent.update(state, ro3)
    torch.testing.assert_close(s2["params"], s3["params"])


@pytest.mark.parametrize("core", ["gru"])
def test_recurrent_ppo_options_run(core):
    config = dataclasses.replace(RPPO, core=core, penalty="kl", normalize_obs=True, normalize_reward=True)
    agent, state, sampler = _recurrent_ppo(config)
    new_state, metrics = agent.update(state, sampler.collect(state))
    assert all(torch.isfinite(v) for v in metrics.values())


def test_recurrent_ppo_bad_options():
    with pytest.raises(ConfigError, match="divide --num-envs"):
        ppo.validate(dataclasses.replace(RPPO, num_minibatches=3))
    with pytest.raises(ConfigError, match="--core"):
        ppo.validate(dataclasses.replace(RPPO, core="rnn"))


def test_recurrent_ppo_compiled_equals_eager_and_does_not_recompile():
    config = dataclasses.replace(RPPO, num_steps=3)
    agent, state, sampler = _recurrent_ppo(config)
    ro1, ro2 = sampler.collect(state).clone(), sampler.collect(state).clone()
    compiled = ppo.make(config, sampler.env.spec, compile=True)
    torch.manual_seed(3)
    eager_state, eager_m = agent.update(state, ro1)
    torch.manual_seed(3)
    comp_state, comp_m = compiled.update(state, ro1)
    torch.testing.assert_close(comp_state["params"], eager_state["params"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(comp_m["loss"], eager_m["loss"], rtol=1e-4, atol=1e-5)
    comp_state["env_steps"] += 12
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled.update(comp_state, ro2)


def test_recurrent_a2c_update_runs_and_masks_invalid_steps():
    from fnrl.algos import a2c

    config = a2c.Config(env_id="fnrl/CartPoleNoVel-v1", num_envs=3, num_steps=5, core="gru", core_size=8, hidden=(8,))
    env = envs.make(config.env_id, config.num_envs, seed=0)
    agent = a2c.make(config, env.spec)
    state = agent.init(0)
    ro = SerialSampler(env, agent.act, config.num_steps).collect(state).clone()
    assert ro["carry", "actor", "h"].shape == (5, 3, 8)
    new_state, metrics = agent.update(state, ro)
    assert all(torch.isfinite(v) for v in metrics.values())
    ro["valid"][2] = False
    ro["done"][1] = True
    ro2 = ro.clone()
    ro2["reward"][2], ro2["action"][2] = 1e6, 1 - ro2["action"][2]
    torch.testing.assert_close(agent.update(state, ro)[0]["params"], agent.update(state, ro2)[0]["params"])


def test_evaluation_resets_the_carry_at_episode_starts(monkeypatch):
    """`evaluate_state` marks the step after EnvPool's reset step as an episode start, as the sampler does."""
    from fnrl import evaluate

    seen = []
    make_agent = evaluate.make_agent

    def recording_agent(*args, **kwargs):
        agent = make_agent(*args, **kwargs)

        def act(state, obs, carry, explore):
            seen.append(None if carry is None else bool(carry["reset"][0]))
            return agent.act(state, obs, carry, explore)

        return agent._replace(act=act)

    monkeypatch.setattr(evaluate, "make_agent", recording_agent)
    config = dataclasses.replace(RPPO, env_id="fnrltest/CountTerm-v0", num_envs=1, num_minibatches=1)
    env = envs.make(config.env_id, 1, seed=0)
    state = ppo.make(config, env.spec).init(0)
    env.close()
    returns = evaluate.evaluate_state("ppo", config, state, episodes=2, num_envs=1)
    assert len(returns) == 2
    # steps 0-3: episode 1 (step 3 is the reset step), step 4 starts episode 2
    assert seen[:6] == [None, False, False, False, True, False]
