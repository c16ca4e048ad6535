"""fnrl.envs.functional: CartPole's dynamics and fnrl's step contract, against gymnasium's CartPole
stepped through fnrl's own adaptor (`BatchedEnv` over `InProcessEnvs`)."""
import numpy as np
import pytest
import torch

from fnrl import envs
from fnrl.envs import functional
from fnrl.envs.batched import BatchedEnv
from fnrl.envs.inprocess import InProcessEnvs
from fnrl.errors import ConfigError

KEYS = ("reward", "terminated", "truncated", "done", "valid", "episode_end", "episode_return", "episode_length")


def test_one_step_from_rest_by_hand():
    """From (0, 0, 0, 0) pushing right: x_acc = 4400/451, theta_acc = -6600/451 (gymnasium's equations
    with sin 0 = 0, cos 0 = 1), and one Euler step of 0.02 s moves only the velocities."""
    env = functional.make("CartPole-v1", 1)
    out = env.dynamics(torch.zeros(1, 4, dtype=torch.float64), torch.tensor([1]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.02 * 4400 / 451, 0.0, -0.02 * 6600 / 451]],
                                                 dtype=torch.float64))


def test_cartpole_steps_as_gymnasium_through_fnrls_adaptor():
    """The same actions through both, gymnasium's envs put in the functional env's initial states (and
    its reset states after every episode): the observations agree to float32 rounding and every
    flag and episode statistic exactly, across terminations, time-limit truncations and reset steps."""
    B, limit, steps = 6, 40, 400
    env = functional.CartPole(B, seed=3, max_episode_steps=limit)
    state = env.reset()
    gym_envs = InProcessEnvs("CartPole-v1", B, max_episode_steps=limit)
    batched = BatchedEnv(gym_envs, envs.env_spec("CartPole-v1", B))
    batched.reset()
    for e, physics in zip(gym_envs.envs, state["physics"].numpy()):
        e.unwrapped.state = physics.copy()
    rng = np.random.default_rng(0)
    seen = {"terminated": 0, "truncated": 0, "reset": 0}
    for _ in range(steps):
        x = state["physics"].numpy()
        balance = (x[:, 2] + 0.5 * x[:, 3] > 0).astype(np.int64)   # keeps the pole up: episodes reach the limit
        action = np.where(np.arange(B) % 2 == 0, balance, rng.integers(0, 2, B))
        state, step = env.step(state, torch.from_numpy(action))
        ref = batched.step_arrays(torch.from_numpy(action))
        for i in np.flatnonzero(~ref["valid"]):   # a reset step: gymnasium drew its own initial state
            gym_envs.envs[i].unwrapped.state = state["physics"][i].numpy().copy()
            ref["obs"][i] = state["physics"][i].numpy().astype(np.float32)
        np.testing.assert_allclose(step["obs"].numpy(), ref["obs"], atol=1e-6)
        for k in KEYS:
            np.testing.assert_array_equal(step[k].numpy(), ref[k], err_msg=k)
        seen["terminated"] += int(ref["terminated"].sum())
        seen["truncated"] += int(ref["truncated"].sum())
        seen["reset"] += int((~ref["valid"]).sum())
    assert min(seen.values()) > 0, seen
    gym_envs.close()


def test_reset_states_are_seeded_and_in_range():
    a, b = functional.make("CartPole-v1", 16, seed=5).reset(), functional.make("CartPole-v1", 16, seed=5).reset()
    assert torch.equal(a["physics"], b["physics"]) and a["physics"].abs().max() <= 0.05
    assert a["obs"].dtype == torch.float32 and not a["ended"].any()
    spec = functional.make("CartPole-v1", 16).spec
    assert (spec.obs_shape, spec.num_actions, spec.num_envs) == ((4,), 2, 16)


def test_unknown_env_is_one_line():
    with pytest.raises(ConfigError, match="'Pendulum-v1' has no torch version for --sampler graph; it has one "
                                          "for: CartPole-v1") as e:
        functional.make("Pendulum-v1", 4)
    assert len(str(e.value).splitlines()) == 1
