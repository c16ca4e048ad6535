"""Compiled off-policy acting (as `fnrl.train` builds it) draws the same actions as eager
acting, and later calls do not recompile."""
import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from fnrl import algos, envs
from fnrl.accel.compiled import make_agent


@pytest.mark.parametrize("name, env_id", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_compiled_act_equals_eager_without_recompiles(name, env_id):
    module = algos.load(name)
    config = dataclasses.replace(algos.default_config(name), env_id=env_id, learning_starts=20)
    env = envs.make(env_id, 4, seed=0)
    eager, compiled = (make_agent(module, config, env.spec, compile=c) for c in (False, True))
    state = eager.init(0)
    obs = env.reset()["obs"]
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        for t in range(40):   # crosses learning_starts: random warm-up, then the policy
            torch.manual_seed(t)
            a_eager, _, _ = eager.act(state, obs, None, True)
            torch.manual_seed(t)
            a_compiled, _, _ = compiled.act(state, obs, None, True)
            torch.testing.assert_close(a_compiled, a_eager)
            obs = env.step(a_eager)["obs"]
            state["env_steps"] += 1
            if t == 30:   # new parameters: both act with them
                state["params"] = state["params"].apply(lambda p: p + 0.05 * torch.randn_like(p))
        assert compiled.act.run is not None   # served by the AOTInductor model (fnrl.accel.aot), no Dynamo graph
        assert counters["stats"]["unique_graphs"] == 0
        for t in range(3):   # evaluation acting goes to the torch.compile'd act
            torch.manual_seed(t)
            a_eager = eager.act(state, obs, None, False)[0]
            torch.manual_seed(t)
            torch.testing.assert_close(compiled.act(state, obs, None, False)[0], a_eager)
    assert counters["stats"]["unique_graphs"] == 1   # one graph: no recompile after the first call


def test_acting_on_passes_only_the_declared_state():
    seen = []

    def act(state, obs, carry, explore):
        seen.append(set(state.keys(include_nested=True, leaves_only=True)))
        return obs, {}, carry

    from tensordict import TensorDict
    from fnrl.accel.compiled import acting_on

    state = TensorDict({"params": {"actor": {"w": torch.ones(2)}, "critic": {"w": torch.ones(3)}},
                        "opt_state": {"mu": torch.zeros(3)}, "env_steps": torch.zeros((), dtype=torch.int64)}, [])
    obs = torch.zeros(4, 3)
    out, extras, carry = acting_on((("params", "actor"), "obs_rms", "env_steps"), act)(state, obs, None, True)
    assert out is obs and extras == {} and carry is None
    assert seen == [{"env_steps", ("params", "actor", "w")}]   # obs_rms absent: skipped


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_act_keys_cover_what_act_reads(name):
    """Eager act on only `SPEC.act_keys` of the state equals act on the whole state."""
    module = algos.load(name)
    env_id = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
    config = dataclasses.replace(algos.default_config(name), env_id=env_id, learning_starts=0)
    env = envs.make(env_id, 3, seed=0)
    agent = module.make(config, env.spec)
    state = agent.init(0)
    obs = env.reset()["obs"]
    for explore in (True, False):
        torch.manual_seed(1)
        full = agent.act(state, obs, None, explore)[0]
        torch.manual_seed(1)
        part = agent.act(state.select(*module.SPEC.act_keys, strict=False), obs, None, explore)[0]
        torch.testing.assert_close(part, full)


SKIP_GUARD_RUNS = {
    "dqn": dict(total_steps=600, learning_starts=200, num_envs=2, num_steps=5, batch_size=16, hidden=(16,),
                replay_ratio=0.5),
    "ppo": dict(total_steps=384, num_envs=4, num_steps=16, update_epochs=2, num_minibatches=2, hidden=(16,)),
}


@pytest.mark.parametrize("name", sorted(SKIP_GUARD_RUNS))
def test_compiled_training_skipping_guards_equals_checking_them(monkeypatch, tmp_path, name):
    """`train(compile=True)` skips Dynamo's guard checks once warm (fnrl.accel.compiled.steady): the same
    parameters as with the checks, off-policy (act, replay add / sample, update) and on-policy."""
    import fnrl.train as train_mod
    from fnrl.accel import AccelOptions

    config = dataclasses.replace(algos.default_config(name), **SKIP_GUARD_RUNS[name])
    states = []
    for skip in (False, True):
        result = train_mod.train(name, config, seed=3, compile=True, quiet=True, log_dir=tmp_path / str(skip),
                                 tensorboard=False, plot=False, accel=AccelOptions(skip_guards=skip))
        states.append(result.state)
        assert result.history[-1]["updates"] > (150 if name == "dqn" else 5)
    torch.testing.assert_close(states[1]["params"], states[0]["params"], rtol=0, atol=0)
    assert not torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe   # the loop's held stance was left


def test_held_stance_enters_once_warm_and_leaves_on_release():
    """The loop holds `steady`'s stance across iterations (fnrl.accel.compiled.HeldStance): entered at
    the first warm `hold`, kept by later ones, left by `release` (twice is harmless)."""
    from fnrl.accel.compiled import HeldStance

    def skipping():
        return torch._dynamo.eval_frame._stance.skip_guard_eval_unsafe

    held = HeldStance()
    held.hold(False)
    assert not skipping()
    held.hold(True)
    held.hold(True)
    assert skipping()
    held.release()
    assert not skipping()
    held.release()
    assert not skipping()


def test_aot_act_serves_training_calls_and_caches_its_package(monkeypatch, tmp_path):
    """AotAct: the AOTInductor model gives eager's outputs; other calls go to the fallback; a
    second AotAct of the same policy loads the cached package instead of compiling."""
    from tensordict import TensorDict

    from fnrl.accel.aot import AotAct

    monkeypatch.setenv("FNRL_CACHE_DIR", str(tmp_path))

    def act(state, obs, carry, explore):
        h = torch.tanh(obs @ state["params", "w"]) * state["scale"]
        return h.argmax(-1), {"value": h.sum(-1), "logp": h[:, 0]}, carry

    def fallback(state, obs, carry, explore):
        calls.append((obs.shape, carry, explore))
        return act(state, obs, carry, explore)

    calls = []
    state = TensorDict({"params": {"w": torch.randn(3, 5)}, "scale": torch.tensor(2.0),
                        "opt": {"m": torch.zeros(5)}}, [])
    obs = torch.randn(4, 3)
    aot = AotAct(act, ("params", "scale"), fallback)
    for _ in range(2):
        got, want = aot(state, obs, None, True), act(state, obs, None, True)
        torch.testing.assert_close(got[0], want[0])
        assert list(got[1]) == ["value", "logp"] and got[2] is None
        torch.testing.assert_close(got[1], want[1])
        state["params", "w"] = torch.randn(3, 5)   # new parameters are read on every call
    assert calls == [] and aot.leaf_keys == [("params", "w"), "scale"]
    aot(state, torch.randn(2, 3), None, True)          # another batch size
    aot(state, obs, None, False)                        # evaluation
    aot(state, obs, torch.zeros(4), True)               # a carry
    assert [c[2] for c in calls] == [True, False, True]
    assert len(list((tmp_path / "aoti").glob("*.pt2"))) == 1

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again instead of loading the cached package")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compile)
    again = AotAct(act, ("params", "scale"), fallback)
    calls.clear()
    torch.testing.assert_close(again(state, obs, None, True)[1], act(state, obs, None, True)[1])
    assert again.run is not None and not again.failed and calls == []   # served by the loaded package
