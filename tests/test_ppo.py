import dataclasses

import pytest
import torch
from tensordict import TensorDict

from fnrl import envs
from fnrl.algos import a2c, common, ppo
from fnrl.errors import ConfigError
from fnrl.samplers import SerialSampler

SMALL = ppo.Config(num_envs=4, num_steps=16, update_epochs=2, num_minibatches=2, total_steps=10_000)


def rollout_for(config, seed=0, collects=1):
    env = envs.make(config.env_id, config.num_envs, seed=seed)
    agent = ppo.make(config, env.spec)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    rollouts = [sampler.collect(state).clone() for _ in range(collects)]
    return agent, state, env.spec, rollouts


def assert_close_td(a, b, **kw):
    for key, x in a.items(include_nested=True, leaves_only=True):
        torch.testing.assert_close(x, b[key], **kw)


def test_update_improves_surrogate_and_masks_invalid_steps():
    agent, state, spec, (ro,) = rollout_for(SMALL)
    new_state, metrics = agent.update(state, ro)
    assert torch.isfinite(metrics["loss"]) and 0 <= metrics["clipfrac"] <= 1
    changed = [not torch.equal(a, b) for a, b in zip(state["params"].values(True, True), new_state["params"].values(True, True))]
    assert all(changed)
    # corrupting an invalid step's data must not change the update
    ro2 = ro.clone()
    ro2["valid"][3] = False
    ro3 = ro2.clone()
    ro3["reward"][3] = 1e6
    ro3["action"][3] = 1 - ro3["action"][3]
    ro3["logp"][3] = -50.0
    ro3["done"][2] = True  # the step before a reset step is done, so the trace is cut there
    ro2["done"][2] = True
    torch.manual_seed(1)
    s2, _ = agent.update(state, ro2)
    torch.manual_seed(1)
    s3, _ = agent.update(state, ro3)
    assert_close_td(s2["params"], s3["params"])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_update_evaluates_the_critic_as_a_plain_loop_does(env_id):
    """Vector observations: acting records no value; the update evaluates the critic on the whole
    rollout in one call. Its value loss before the first step and its explained variance equal a
    plain loop's: the critic at each step's observation, bootstrapped from the last next
    observation, advantages by a reverse loop (termination cuts the bootstrap, done the trace)."""
    config = dataclasses.replace(SMALL, env_id=env_id, num_steps=64, update_epochs=1, num_minibatches=1)
    agent, state, spec, (ro,) = rollout_for(config)
    assert "value" not in ro.keys() and (~ro["valid"]).any() == (env_id == "CartPole-v1")
    _, policy = common.actor_critic_policy(spec, config.hidden, config.activation)
    critic = [policy(state["params"], ro["obs"][t])[1] for t in range(config.num_steps)]
    critic.append(policy(state["params"], ro["next_obs"][-1])[1])
    gamma, lam = config.gamma, config.gae_lambda
    adv, advantages = torch.zeros(config.num_envs), []
    for t in reversed(range(config.num_steps)):
        discount = gamma * (~ro["terminated"][t]).float()
        adv = ro["reward"][t] + discount * critic[t + 1] - critic[t] + discount * lam * (~ro["done"][t]).float() * adv
        advantages.insert(0, adv)
    value, target = torch.stack(critic[:-1]), torch.stack(advantages) + torch.stack(critic[:-1])
    valid = ro["valid"]
    spread = common.masked_mean((target - common.masked_mean(target, valid)) ** 2, valid)
    _, metrics = agent.update(state, ro)
    torch.testing.assert_close(metrics["loss/value"], common.masked_mean(0.5 * (value - target) ** 2, valid))
    torch.testing.assert_close(metrics["explained_variance"],
                               1 - common.masked_mean((target - value) ** 2, valid) / (spread + 1e-8))


@pytest.mark.parametrize("overrides", [dict(penalty="kl"), dict(normalize_obs=True, normalize_reward=True, clip_vloss=True)])
def test_options_run(overrides):
    config = dataclasses.replace(SMALL, **overrides)
    agent, state, _, (ro,) = rollout_for(config)
    new_state, metrics = agent.update(state, ro)
    assert all(torch.isfinite(v).all() for v in metrics.values())
    if config.penalty == "kl":
        assert new_state["kl_coef"] != state["kl_coef"] or metrics["kl_coef"] == state["kl_coef"]
    if config.normalize_obs:
        assert new_state["obs_rms", "count"] > state["obs_rms", "count"]
        assert new_state["rew_rms", "count"] > state["rew_rms", "count"]


def test_continuous_actions():
    config = dataclasses.replace(SMALL, env_id="Pendulum-v1")
    agent, state, spec, (ro,) = rollout_for(config)
    assert ro["action"].shape == (16, 4, 1) and "log_std" in state["params"].keys()
    new_state, metrics = agent.update(state, ro)
    assert torch.isfinite(metrics["loss"])


@pytest.mark.parametrize("ahead_of_time, scan", [(False, True), (True, True), (False, False)],
                         ids=["torch_compile", "ahead_of_time", "loop"])
def test_compiled_update_equals_eager_and_does_not_recompile(monkeypatch, ahead_of_time, scan):
    """Compiled updates equal eager ones: the torch.compile'd pieces without recompiling on a
    second rollout, the whole iteration ahead of time (no fallback), which hands a rollout
    laid out otherwise to the compiled pieces, and the minibatch steps as a loop of one
    compiled step (what a GPU runs, `fnrl.accel.staged.scan_on`)."""
    import warnings

    from fnrl.accel import staged

    monkeypatch.setattr(staged, "scan_on", lambda device: scan)
    agent, state, spec, (ro1, ro2) = rollout_for(SMALL, collects=2)
    compiled = ppo.make(SMALL, spec, compile=True, ahead_of_time=ahead_of_time)
    torch.manual_seed(3)
    eager_state, eager_m = agent.update(state, ro1)
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the PPO update is not ahead-of-time")   # no fallback
        comp_state, comp_m = compiled.update(state, ro1)
    assert_close_td(eager_state["params"], comp_state["params"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(eager_m["loss"], comp_m["loss"], rtol=1e-4, atol=1e-5)
    comp_state["env_steps"] += 64
    with torch._dynamo.config.patch(error_on_recompile=True):
        comp_state, _ = compiled.update(comp_state, ro2)
        compiled.update(comp_state, ro1)
    if ahead_of_time:   # rewards [T, B] stored column-major: not the model's layout
        odd = ro2.clone()
        odd["reward"] = ro2["reward"].t().contiguous().t()
        assert odd["reward"].stride() != ro2["reward"].stride()
        assert_close_td(compiled.update(comp_state, odd)[0]["params"], compiled.update(comp_state, ro2)[0]["params"],
                        rtol=1e-5, atol=1e-6)


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="does not divide"):
        ppo.validate(dataclasses.replace(SMALL, num_minibatches=3))
    with pytest.raises(ConfigError, match="penalty"):
        ppo.validate(dataclasses.replace(SMALL, penalty="both"))
    with pytest.raises(ConfigError, match="positive"):
        a2c.validate(a2c.Config(num_envs=0))


def test_masked_means_of_several_terms_equal_one_at_a_time_eager_and_under_vmap():
    g = torch.Generator().manual_seed(0)
    x, y, z = torch.randn(3, 4, 16, generator=g)
    mask = torch.rand(4, 16, generator=g) > 0.3
    one_at_a_time = [(t * mask).sum() / mask.sum() for t in (x, y, z)]
    for got in (common.masked_means(mask, x.dtype)(x, y, z),
                torch.vmap(lambda a: torch.stack(common.masked_means(mask, a.dtype)(a, y, z)))(x[None])[0]):
        torch.testing.assert_close(torch.stack(tuple(got)), torch.stack(one_at_a_time))
    assert common.masked_means(mask, x.dtype)(x).ndim == 0
    assert common.masked_means(torch.zeros(4, 16, dtype=torch.bool), x.dtype)(x, y)[1] == 0   # no valid step


def test_take_rows_is_indexing_by_rows():
    g = torch.Generator().manual_seed(0)
    batch = TensorDict({"obs": torch.randn(8, 3, generator=g), "action": torch.randint(0, 2, (8,), generator=g)},
                       batch_size=[8])
    index = torch.randperm(8, generator=g)[:5]
    rows = common.take_rows(batch, index)
    assert rows.batch_size == (5,) and set(rows.keys()) == set(batch.keys())
    assert all(torch.equal(rows[k], batch[index][k]) for k in batch.keys())
    nested = TensorDict({"obs": {"pixels": torch.randn(8, 2, generator=g)}}, batch_size=[8])   # the generic path
    torch.testing.assert_close(common.take_rows(nested, index)["obs", "pixels"], nested["obs", "pixels"][index])


def test_unchecked_tensordict_holds_a_torch_size():
    """A batch size given as a list is kept as a `torch.Size`, as `TensorDict` keeps it: a compiled
    function's guards on a state built eagerly then hold (a list's type id would recompile it)."""
    from fnrl.tensordicts import unchecked_tensordict
    td = unchecked_tensordict({"x": torch.zeros(3)}, [3])
    assert type(td.batch_size) is torch.Size and td.batch_size == (3,)
    assert type(unchecked_tensordict({}, []).batch_size) is torch.Size


def test_scan_steps_compiled_equals_the_python_loop():
    """`scan_steps` inside torch.compile (torch's scan) gives the Python loop's carry and stacked
    outputs, and rebuilds the carry TensorDicts exactly: key order, empty nested ones, and a
    leaf the step passes through unchanged."""
    from fnrl.algos.common import scan_steps

    def step(carry, x):
        params, opt = carry
        new_params = params.apply(lambda p: p * 0.5 + x.sum())
        new_opt = opt.clone(recurse=False)
        new_opt["1", "count"] = opt["1", "count"] + 1
        return (new_params, new_opt), {"loss": x.mean() + new_params["w"].sum(), "count": new_opt["1", "count"]}

    params = TensorDict({"w": torch.randn(3), "net": {"b": torch.randn(2)}}, [])
    opt = TensorDict({"0": {}, "1": {"count": torch.zeros((), dtype=torch.int64), "rate": torch.tensor(0.1)}}, [])
    xs = torch.randn(5, 4)

    def run(params, opt, xs):
        return scan_steps(step, (params, opt), xs)

    (p_loop, o_loop), out_loop = run(params, opt, xs)
    (p_scan, o_scan), out_scan = torch.compile(run, fullgraph=True, dynamic=False)(params, opt, xs)
    assert list(o_scan.keys(True)) == list(o_loop.keys(True)) == list(opt.keys(True))
    assert list(p_scan.keys(True)) == list(params.keys(True))
    assert_close_td(p_scan, p_loop, rtol=1e-6, atol=1e-6)
    assert_close_td(o_scan, o_loop, rtol=0, atol=0)
    assert out_scan["count"].tolist() == [1, 2, 3, 4, 5]
    torch.testing.assert_close(out_scan["loss"], out_loop["loss"])


def test_switch_runs_the_taken_branch_eager_compiled_and_per_row_under_vmap():
    """`switch` (torch.cond over TensorDicts): the branch `pred` picks, with nested batch sizes
    (stacked critics), empty nested TensorDicts and a leaf passed through kept; one graph for
    both values of `pred`; under vmap each row takes its own branch."""
    from fnrl.algos.common import switch

    def step(pred, params, opt):
        def on(params, opt):
            return (params.apply(lambda p: p + 1.0), opt), (params["w"].sum(), params["w"].sum())

        def off(params, opt):
            return (params, opt), (-params["w"].sum(), params["w"].sum())

        return switch(pred, on, off, (params, opt))

    params = TensorDict({"w": torch.randn(3), "critic": TensorDict({"b": torch.randn(2, 4)}, [2])}, [])
    opt = TensorDict({"0": {}, "1": {"rate": torch.tensor(0.1)}}, [])
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    for pred in (True, False):
        (p_eager, o_eager), m_eager = step(torch.tensor(pred), params, opt)
        with torch._dynamo.config.patch(error_on_recompile=not pred):
            (p_comp, o_comp), m_comp = compiled(torch.tensor(pred), params, opt)
        expected = params.apply(lambda p: p + 1.0) if pred else params
        for p, o, m in ((p_eager, o_eager, m_eager), (p_comp, o_comp, m_comp)):
            assert_close_td(p, expected, rtol=0, atol=0)
            assert p["critic"].batch_size == torch.Size([2]) and list(o.keys(True)) == list(opt.keys(True))
            torch.testing.assert_close(m[0], params["w"].sum() * (1 if pred else -1))
    rows = torch.stack([params, params])
    for vmapped in (torch.func.vmap(step), torch.compile(torch.func.vmap(step), fullgraph=True, dynamic=False)):
        (p_rows, _), m_rows = vmapped(torch.tensor([True, False]), rows, torch.stack([opt, opt]))
        assert_close_td(p_rows[0], params.apply(lambda p: p + 1.0), rtol=0, atol=0)
        assert_close_td(p_rows[1], params, rtol=0, atol=0)
        torch.testing.assert_close(m_rows[0], torch.stack([params["w"].sum(), -params["w"].sum()]))
