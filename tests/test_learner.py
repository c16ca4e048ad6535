"""fnrl.learner: the fused learner step (sample -> update -> priorities in one compiled graph,
the state donated), through torch.compile and ahead of time, equals replay.sample + update +
replay.update_priorities done eagerly."""
import dataclasses
import warnings

import pytest
import torch
from tensordict import TensorDict

from fnrl import replay
from fnrl.algos import dqn
from fnrl.envs.spec import EnvSpec
from fnrl.learner import make_learner

OBS, A, T, B = 3, 2, 8, 2
SPEC = EnvSpec("Toy-v0", B, (OBS,), torch.float32, (), torch.int64, num_actions=A)


def rollout(seed: int) -> TensorDict:
    """A [T, B] rollout with episode ends and reset steps at fixed places."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, B, OBS, generator=g)
    done = torch.zeros(T, B, dtype=torch.bool)
    done[2, 0], done[5, 1] = True, True
    valid = torch.ones(T, B, dtype=torch.bool)
    valid[3, 0], valid[6, 1] = False, False   # the step after each end resets its env
    return TensorDict({"obs": obs[:-1], "next_obs": obs[1:], "action": torch.randint(0, A, (T, B), generator=g),
                       "reward": torch.randn(T, B, generator=g), "terminated": done.clone(),
                       "truncated": torch.zeros(T, B, dtype=torch.bool), "done": done, "valid": valid},
                      batch_size=[T, B])


def buffer(config) -> replay.ReplayBuffer:
    buf = replay.init(rollout(0), 64, n_step=config.n_step, gamma=config.gamma, prioritized=config.prioritized,
                      alpha=config.priority_alpha)
    for seed in range(4):
        buf = replay.add(buf, rollout(seed))
    return buf


@pytest.mark.parametrize("ahead_of_time", [False, True], ids=["torch_compile", "ahead_of_time"])
def test_fused_learner_equals_eager_sample_update_and_priorities_without_recompiles(ahead_of_time):
    config = dataclasses.replace(dqn.Config(), **{**dqn.VARIANTS["rainbow"], **dict(
        hidden=(16,), num_envs=B, batch_size=16, buffer_size=64, learning_starts=0, num_atoms=11,
        target_update_interval=2)})
    assert config.prioritized and config.n_step == 3
    agent = dqn.make(config, SPEC)
    eager_buffer, fused_buffer = buffer(config), buffer(config)
    eager = make_learner(agent.update, config.batch_size, True, fused=False)
    fused = make_learner(agent.update, config.batch_size, True, fused=True, ahead_of_time=ahead_of_time)
    eager_state, fused_state = agent.init(0), agent.init(0)
    passed_in = fused_state
    for i in range(3):
        torch.manual_seed(10 + i)
        eager_state, eager_buffer, eager_metrics = eager(eager_state, eager_buffer, 0.4 + 0.1 * i)
        torch.manual_seed(10 + i)
        with torch.compiler.set_stance("fail_on_recompile" if i > 0 else "default"), warnings.catch_warnings():
            warnings.filterwarnings("error", message="the learner step is not ahead-of-time")   # no fallback
            fused_state, fused_buffer, fused_metrics = fused(fused_state, fused_buffer, 0.4 + 0.1 * i)
        assert fused_state is passed_in   # donated: the new state is written into the one passed in
        torch.testing.assert_close(fused_state.flatten_keys(".").to_dict(),
                                   eager_state.flatten_keys(".").to_dict(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_metrics["priority"], eager_metrics["priority"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_buffer.rows["priority"], eager_buffer.rows["priority"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_buffer.tree, eager_buffer.tree, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_buffer.max_priority, eager_buffer.max_priority)
    assert int(fused_state["updates"]) == 3


def test_ahead_of_time_learner_falls_back_to_torch_compile_with_a_warning():
    """A step the ahead-of-time path does not serve (here: nested metrics) runs through
    torch.compile instead, with the same results as eager."""
    config = dataclasses.replace(dqn.Config(), hidden=(8,), num_envs=B, batch_size=8, buffer_size=64,
                                 learning_starts=0)
    agent = dqn.make(config, SPEC)

    def update(state, batch):
        state, metrics = agent.update(state, batch)
        metrics["nested"] = TensorDict({"loss": metrics["loss/q"]}, batch_size=[])
        return state, metrics

    eager = make_learner(update, config.batch_size, False, fused=False)
    fused = make_learner(update, config.batch_size, False, fused=True, ahead_of_time=True)
    eager_state, fused_state = agent.init(0), agent.init(0)
    eager_buffer, fused_buffer = buffer(config), buffer(config)
    for i in range(2):
        torch.manual_seed(i)
        eager_state, eager_buffer, _ = eager(eager_state, eager_buffer, 0.4)
        torch.manual_seed(i)
        if i == 0:
            with pytest.warns(UserWarning, match="not ahead-of-time compiled .*flat dict of tensors"):
                fused_state, fused_buffer, metrics = fused(fused_state, fused_buffer, 0.4)
        else:
            fused_state, fused_buffer, metrics = fused(fused_state, fused_buffer, 0.4)
        torch.testing.assert_close(fused_state.flatten_keys(".").to_dict(),
                                   eager_state.flatten_keys(".").to_dict(), rtol=1e-5, atol=1e-6)
    assert metrics["nested", "loss"].shape == ()
