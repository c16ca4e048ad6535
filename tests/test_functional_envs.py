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


def _cartpole_actions(physics, rng):
    """Even envs balance the pole (episodes reach the time limit), odd ones act at random."""
    balance = (physics[:, 2] + 0.5 * physics[:, 3] > 0).astype(np.int64)
    return np.where(np.arange(len(physics)) % 2 == 0, balance, rng.integers(0, 2, len(physics)))


def _pendulum_actions(physics, rng):
    """Torques beyond the bounds too (the env clips them)."""
    return rng.uniform(-3.0, 3.0, (len(physics), 1)).astype(np.float32)


def _mountain_car_actions(physics, rng):
    """Even envs push along their velocity (they reach the goal), odd ones act at random."""
    pump = np.where(physics[:, 1] >= 0, 2, 0)
    return np.where(np.arange(len(physics)) % 2 == 0, pump, rng.integers(0, 3, len(physics)))


def _acrobot_actions(physics, rng):
    """Even envs torque along the second link's swing (they reach the goal), odd ones act at random."""
    pump = np.where(physics[:, 3] > 0, 2, 0)
    return np.where(np.arange(len(physics)) % 2 == 0, pump, rng.integers(0, 3, len(physics)))


def _mountain_car_continuous_actions(physics, rng):
    """Even envs push along their velocity with forces beyond the bounds (the env clips them, the
    energy cost does not), odd ones at random."""
    pump = np.where(physics[:, 1] >= 0, 1.3, -1.3)
    return np.where(np.arange(len(physics)) % 2 == 0, pump, rng.uniform(-1.5, 1.5, len(physics)))[:, None] \
        .astype(np.float32)


@pytest.mark.parametrize("env_id, actions, limit, terminates, chaotic", [
    ("CartPole-v1", _cartpole_actions, 40, True, False), ("Acrobot-v1", _acrobot_actions, 150, True, True),
    ("Pendulum-v1", _pendulum_actions, 25, False, False), ("MountainCar-v0", _mountain_car_actions, 150, True, False),
    ("MountainCarContinuous-v0", _mountain_car_continuous_actions, 150, True, False)])
def test_steps_as_gymnasium_through_fnrls_adaptor(env_id, actions, limit, terminates, chaotic):
    """The same actions through both, gymnasium's envs put in the functional env's initial states (and
    its reset states after every episode): the observations agree to float32 rounding, rewards and
    returns to float32's, every flag and length exactly, across terminations, time-limit
    truncations and reset steps (where an episode terminates on its last allowed step, gymnasium's
    TimeLimit reports it truncated too; fnrl's functional envs, terminated only). A chaotic system
    (Acrobot's double pendulum) would turn the libraries' last-bit differences in sin and cos into
    different trajectories, so there gymnasium restarts every step from the functional env's state:
    each transition is compared, not the run."""
    B, steps = 6, 400
    torch.manual_seed(0)   # the reset states drawn after episode ends
    env = functional.ENVS[env_id](B, seed=3, max_episode_steps=limit)
    state = env.reset()
    gym_envs = InProcessEnvs(env_id, B, max_episode_steps=limit)
    batched = BatchedEnv(gym_envs, envs.env_spec(env_id, B))
    batched.reset()
    for e, physics in zip(gym_envs.envs, state["physics"].numpy()):
        e.unwrapped.state = physics.copy()
    rng = np.random.default_rng(0)
    seen = {"truncated": 0, "reset": 0, "terminated": 0}
    for _ in range(steps):
        if chaotic:
            for e, physics in zip(gym_envs.envs, state["physics"].numpy()):
                e.unwrapped.state = physics.copy()
        action = actions(state["physics"].numpy(), rng)
        state, step = env.step(state, torch.from_numpy(action))
        ref = batched.step_arrays(torch.from_numpy(action))
        ref["truncated"] &= ~ref["terminated"]
        for i in np.flatnonzero(~ref["valid"]):   # a reset step: gymnasium drew its own initial state
            gym_envs.envs[i].unwrapped.state = state["physics"][i].numpy().copy()
            ref["obs"][i] = env.observe(state["physics"][i:i + 1])[0].numpy()
        np.testing.assert_allclose(step["obs"].numpy(), ref["obs"], atol=1e-6)
        for k in KEYS:
            if step[k].dtype == torch.bool or k == "episode_length":
                np.testing.assert_array_equal(step[k].numpy(), ref[k], err_msg=k)
            else:
                np.testing.assert_allclose(step[k].numpy(), ref[k], rtol=1e-6, atol=1e-6, err_msg=k)
        seen["terminated"] += int(ref["terminated"].sum())
        seen["truncated"] += int(ref["truncated"].sum())
        seen["reset"] += int((~ref["valid"]).sum())
    assert seen["truncated"] and seen["reset"] and (seen["terminated"] > 0) == terminates, seen
    gym_envs.close()


def test_reset_states_are_seeded_and_in_range():
    a, b = functional.make("CartPole-v1", 16, seed=5).reset(), functional.make("CartPole-v1", 16, seed=5).reset()
    assert torch.equal(a["physics"], b["physics"]) and a["physics"].abs().max() <= 0.05
    assert a["obs"].dtype == torch.float32 and not a["ended"].any()
    spec = functional.make("CartPole-v1", 16).spec
    assert (spec.obs_shape, spec.num_actions, spec.num_envs) == ((4,), 2, 16)


@pytest.mark.parametrize("env_id", functional.available())
def test_specs_are_the_envpool_envs(env_id):
    """Networks built for one backend fit the other: the same shapes, dtypes, bounds and time limit."""
    ours, theirs = functional.make(env_id, 3).spec, envs.env_spec(env_id, 3)
    for field in ("env_id", "num_envs", "obs_shape", "obs_dtype", "action_shape", "action_dtype", "num_actions",
                  "max_episode_steps"):
        assert getattr(ours, field) == getattr(theirs, field), field
    for field in ("action_low", "action_high"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert (a is None and b is None) or torch.equal(a, b), field


def test_partially_observed_variant_is_its_base_env_seen_through_the_kept_entries():
    """fnrl/CartPoleNoVel-v1 (fnrl.envs.FNRL_ENVS): CartPole-v1's steps, observing position and angle."""
    variant, base = functional.make("fnrl/CartPoleNoVel-v1", 5, seed=2), functional.make("CartPole-v1", 5, seed=2)
    a, b = variant.reset(), base.reset()
    ends = 0
    for t in range(60):
        action = torch.tensor([t % 2, 1, 0, (t // 3) % 2, 1])
        torch.manual_seed(t)
        a, step_a = variant.step(a, action)
        torch.manual_seed(t)
        b, step_b = base.step(b, action)
        assert torch.equal(step_a["obs"], step_b["obs"][:, [0, 2]]) and torch.equal(a["physics"], b["physics"])
        assert all(torch.equal(step_a[k], step_b[k]) for k in KEYS)
        ends += int(step_b["episode_end"].sum())
    assert ends > 0   # reset states drawn inside the steps too


def test_unknown_env_is_one_line():
    with pytest.raises(ConfigError, match="'LunarLander-v3' has no torch version for --sampler graph; it has one "
                                          "for: CartPole-v1, Acrobot-v1, Pendulum-v1, MountainCar-v0") as e:
        functional.make("LunarLander-v3", 4)
    assert len(str(e.value).splitlines()) == 1
