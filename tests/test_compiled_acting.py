"""Compiled off-policy acting (as `fnrl.train` builds it) draws the same actions as eager
acting, and later calls do not recompile."""
import dataclasses

import pytest
import torch
from torch._dynamo.utils import counters

from fnrl import algos, envs
from fnrl.train import _make_agent


@pytest.mark.parametrize("name, env_id", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_compiled_act_equals_eager_without_recompiles(name, env_id):
    module = algos.load(name)
    config = dataclasses.replace(algos.default_config(name), env_id=env_id, learning_starts=20)
    env = envs.make(env_id, 4, seed=0)
    eager, compiled = (_make_agent(module, config, env.spec, compile=c) for c in (False, True))
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
    assert counters["stats"]["unique_graphs"] == 1   # one graph: no recompile after the first call


def test_acting_on_passes_only_the_declared_state():
    seen = []

    def act(state, obs, carry, explore):
        seen.append(set(state.keys(include_nested=True, leaves_only=True)))
        return obs, {}, carry

    from tensordict import TensorDict
    from fnrl.train import acting_on

    state = TensorDict({"params": {"actor": {"w": torch.ones(2)}, "critic": {"w": torch.ones(3)}},
                        "opt_state": {"mu": torch.zeros(3)}, "env_steps": torch.zeros((), dtype=torch.int64)}, [])
    obs = torch.zeros(4, 3)
    out, extras, carry = acting_on((("params", "actor"), "obs_rms", "env_steps"), act)(state, obs, None, True)
    assert out is obs and extras == {} and carry is None
    assert seen == [{"env_steps", ("params", "actor", "w")}]   # obs_rms absent: skipped


@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_act_keys_cover_what_act_reads(name):
    """Eager act on only ACT_KEYS of the state equals act on the whole state."""
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
        part = agent.act(state.select(*module.ACT_KEYS, strict=False), obs, None, explore)[0]
        torch.testing.assert_close(part, full)


SKIP_GUARD_RUNS = {
    "dqn": dict(total_steps=600, learning_starts=200, num_envs=2, num_steps=5, batch_size=16, hidden=(16,),
                replay_ratio=0.5),
    "ppo": dict(total_steps=384, num_envs=4, num_steps=16, update_epochs=2, num_minibatches=2, hidden=(16,)),
}


@pytest.mark.parametrize("name", sorted(SKIP_GUARD_RUNS))
def test_compiled_training_skipping_guards_equals_checking_them(monkeypatch, tmp_path, name):
    """`train(compile=True)` skips Dynamo's guard checks once warm (fnrl.train._steady): the same
    parameters as with the checks, off-policy (act, replay add / sample, update) and on-policy."""
    import fnrl.train as train_mod

    config = dataclasses.replace(algos.default_config(name), **SKIP_GUARD_RUNS[name])
    states = []
    for skip in (False, True):
        monkeypatch.setattr(train_mod, "SKIP_GUARDS", skip)
        result = train_mod.train(name, config, seed=3, compile=True, quiet=True, log_dir=tmp_path / str(skip),
                                 tensorboard=False, plot=False)
        states.append(result.state)
        assert result.history[-1]["updates"] > (150 if name == "dqn" else 5)
    torch.testing.assert_close(states[1]["params"], states[0]["params"], rtol=0, atol=0)
