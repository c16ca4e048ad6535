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
