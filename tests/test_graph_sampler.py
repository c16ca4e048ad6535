"""fnrl.samplers.graph: a rollout of the functional CartPole and the policy as one compiled scan.

The compiled model draws its random numbers from Inductor's generator, not eager's (Inductor's
`fallback_random` fails inside a scan in torch 2.13), so eager and compiled rollouts are not
compared number for number. Each is checked against what eager code computes from the rollout
itself: every step's next observation is the env's dynamics of its observation and action (or a
reset state after an episode end), every log-prob and value is the eager policy's, and the flags
and episode statistics follow the step contract."""
import pytest
import torch
from tensordict import TensorDict

from fnrl.algos import common, ppo
from fnrl.accel.aot import AotAct
from fnrl.cli import main
from fnrl.envs import functional
from fnrl.errors import ConfigError
from fnrl.samplers import SerialSampler, make
from fnrl.samplers.graph import GraphSampler
from fnrl import envs
from tests.learning import assert_most_seeds_reach, final_evaluations

CONFIG = ppo.Config()   # the default run's shapes (8 envs x 32 steps): its rollout model is shared with
#                         the learning test below through the package cache


def _agent(seed=0):
    env = functional.make(CONFIG.env_id, CONFIG.num_envs, seed=seed)
    agent = ppo.make(CONFIG, env.spec, compile=False)
    return env, agent, agent.init(seed)


PHYSICS_OF = {   # the env's physics from its observation (float32-rounded)
    "CartPole-v1": lambda obs: obs.double(),
    "Pendulum-v1": lambda obs: torch.stack([torch.atan2(obs[..., 1], obs[..., 0]), obs[..., 2]], -1).double(),
    "MountainCarContinuous-v0": lambda obs: obs,   # float32 physics, observed as they are
}


def check_rollout(rollout, state, env, config=CONFIG):
    """The rollout is what eager code computes from its own observations and actions."""
    obs, next_obs, action, valid = rollout["obs"], rollout["next_obs"], rollout["action"], rollout["valid"]
    moved, reward, _ = env.transition(PHYSICS_OF[env.spec.env_id](obs.flatten(0, 1)), action.flatten(0, 1))
    stepped = env.observe(moved).view_as(next_obs)
    torch.testing.assert_close(next_obs[valid], stepped[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rollout["reward"][valid], reward.float().view_as(valid)[valid], atol=1e-4, rtol=1e-5)
    assert (~valid).any() and torch.all(rollout["reward"][~valid] == 0)   # reset steps
    assert torch.equal(valid[1:], ~rollout["done"][:-1])   # valid[t] = not done[t - 1]
    _, policy = common.actor_critic_policy(env.spec, config.hidden, config.activation)
    d, _ = policy(state["params"], obs)
    torch.testing.assert_close(rollout["logp"], common.action_dist(env.spec).log_prob(*d, action),
                               atol=1e-5, rtol=1e-5)
    end = rollout["episode_end"]
    assert torch.equal(end, rollout["done"]) and end.any()
    assert torch.all(rollout["episode_return"][~end] == 0) and torch.all(rollout["episode_length"][~end] == 0)


def test_rollout_keys_are_the_serial_samplers():
    env, agent, state = _agent()
    rollout = GraphSampler(env, agent.act, 4).collect(state)
    serial = SerialSampler(envs.make(CONFIG.env_id, CONFIG.num_envs, seed=0), agent.act, 4)
    reference = serial.collect(state)
    assert set(rollout.keys()) == set(reference.keys()) and rollout.batch_size == reference.batch_size
    for k in reference.keys():
        assert rollout[k].dtype == reference[k].dtype, k
    serial.close()


def test_eager_rollout_follows_the_env_and_the_policy_and_carries_over():
    env, agent, state = _agent()
    sampler = make("graph", env, agent.act, CONFIG.num_steps)
    first = sampler.collect(state).clone()
    check_rollout(first, state, env)
    second = sampler.collect(state)
    assert torch.equal(second["obs"][0], first["next_obs"][-1])
    check_rollout(second, state, env)


def test_episode_statistics_across_collects():
    """An episode that spans collects is counted whole: lengths and returns as one env's own count."""
    env, agent, state = _agent()
    sampler = GraphSampler(env, agent.act, 7)   # collects shorter than CartPole's first episodes
    length = torch.zeros(CONFIG.num_envs)
    for _ in range(12):
        r = sampler.collect(state)
        for t in range(7):
            length = torch.where(r["valid"][t], length + 1, 0.0)
            ended = r["episode_end"][t]
            assert torch.equal(r["episode_length"][t][ended], length[ended])


def test_compiled_rollout_follows_the_env_and_the_policy_is_seeded_and_built_once():
    env, agent, state = _agent()
    act = AotAct(agent.act, ppo.ACT_KEYS, fallback=None)
    torch.manual_seed(0)
    sampler = GraphSampler(env, act, CONFIG.num_steps)
    first = sampler.collect(state).clone()
    assert sampler.model is not None
    model = sampler.model
    check_rollout(first, state, env)
    second = sampler.collect(state)
    assert sampler.model is model and torch.equal(second["obs"][0], first["next_obs"][-1])
    check_rollout(second, state, env)
    torch.manual_seed(0)   # the same seed and state: the same rollout
    again = GraphSampler(functional.make(CONFIG.env_id, CONFIG.num_envs, seed=0), act, CONFIG.num_steps)
    assert (again.collect(state) == first).all()


def test_compiled_pendulum_rollout_follows_the_env_and_a_gaussian_policy():
    """Continuous actions: the Gaussian policy's samples, beyond the torque bounds too, clipped by the env."""
    config = ppo.Config(env_id="Pendulum-v1", num_envs=4, num_steps=64)
    env = functional.make("Pendulum-v1", 4, seed=0)
    agent = ppo.make(config, env.spec, compile=False)
    state = agent.init(0)
    sampler = GraphSampler(env, AotAct(agent.act, ppo.ACT_KEYS, fallback=None), 64)
    for _ in range(4):   # 256 steps: past the 200-step time limit
        rollout = sampler.collect(state)
        assert sampler.model is not None
    check_rollout(rollout, state, env, config)
    assert rollout["truncated"].any() and not rollout["terminated"].any()


def test_eager_mountain_car_continuous_rollout_follows_the_env_and_the_policy():
    """A task whose physics are float32 (the observation is a copy of them: a scan's carry may alias
    nothing), through the eager scan, which traces its body as the compiled one does."""
    config = ppo.Config(env_id="MountainCarContinuous-v0", num_envs=4, num_steps=16)
    env = functional.ENVS[config.env_id](4, seed=0, max_episode_steps=10)   # time limits within the rollout
    agent = ppo.make(config, env.spec, compile=False)
    state = agent.init(0)
    rollout = GraphSampler(env, agent.act, 16).collect(state)
    check_rollout(rollout, state, env, config)
    assert rollout["truncated"].any()


def test_vmapped_seeds_act_each_on_its_own_envs():
    """`--num-seeds R --sampler graph`: one functional pool of R x B envs, row r's policy on columns
    r*B .. (r+1)*B - 1 (fnrl.seeds' layout), each consistent with that row's own parameters."""
    from fnrl import algos
    from fnrl import seeds as vmapped

    module, R, B = algos.load("ppo"), 2, CONFIG.num_envs
    rows = vmapped.make_rows(module, CONFIG, 0, R, None)
    env = functional.make(CONFIG.env_id, R * B, seed=0)
    agent = vmapped.make_agent(module, rows, env.spec, B, compile=False)
    state = agent.init(0)
    rollout = GraphSampler(env, agent.act, CONFIG.num_steps).collect(state)
    row_env = functional.make(CONFIG.env_id, B)
    for r in range(R):
        check_rollout(rollout[:, r * B:(r + 1) * B], state[r], row_env)
    assert not (state[0]["params"] == state[1]["params"]).all()   # two seeds: two policies


def test_a_rollout_that_cannot_be_compiled_warns_once_and_collects_eagerly(monkeypatch):
    from fnrl.accel import aot

    def refuse(*args, **kwargs):
        raise RuntimeError("no model today\nsecond line")

    monkeypatch.setattr(aot, "AotFunction", refuse)
    env, agent, state = _agent()
    sampler = GraphSampler(env, AotAct(agent.act, ppo.ACT_KEYS, fallback=None), CONFIG.num_steps)
    with pytest.warns(UserWarning, match=r"the graph sampler's rollout is not ahead-of-time compiled "
                                         r"\(RuntimeError: no model today\); collecting eagerly"):
        first = sampler.collect(state).clone()
    check_rollout(first, state, env)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_rollout(sampler.collect(state), state, env)   # no second attempt, no second warning
    assert sampler.model is None


RNN = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", num_envs=4, num_steps=16, core="lstm", core_size=8, hidden=(8,))


def _recurrent_agent():
    env = functional.make(RNN.env_id, RNN.num_envs, seed=0)
    agent = ppo.make(RNN, env.spec, compile=False)
    return env, agent, agent.init(0)


def _loop_rollouts(env, act, state, collects):
    """The plain-loop reference of a recurrent rollout: act and env.step one step at a time under
    the serial sampler's carry protocol (reset[t] = not valid[t - 1], True at the first step)."""
    B, T = RNN.num_envs, RNN.num_steps
    env_state, carry, reset = env.reset(), None, torch.ones(B, dtype=torch.bool)
    out = []
    for _ in range(collects):
        steps = []
        for _ in range(T):
            obs = env_state["obs"]
            action, extras, carry = act(state, obs, None if carry is None else carry.clone(recurse=False).set(
                "reset", reset), False)
            env_state, step = env.step(env_state, action)
            steps.append(TensorDict({**step, "obs": obs, "next_obs": step["obs"], "action": action, "reset": reset,
                                     **extras}, batch_size=[B]))
            reset = ~step["valid"]
        out.append(torch.stack(steps))
    return out


def test_recurrent_eager_rollout_is_the_plain_loops():
    """A recurrent policy's carry travels in the scan: the rollouts (the carry each step started from,
    the reset mask, everything else) equal the step-by-step loop's, across collects and episode ends."""
    env, agent, state = _recurrent_agent()
    torch.manual_seed(5)   # the reset draws after episode ends come from the global generator
    sampler = GraphSampler(env, agent.act, RNN.num_steps)
    got = [sampler.collect(state, explore=False).clone() for _ in range(3)]
    torch.manual_seed(5)
    reference = _loop_rollouts(functional.make(RNN.env_id, RNN.num_envs, seed=0), agent.act, state, 3)
    assert sum(r["episode_end"].sum() for r in reference) > 0
    for a, b in zip(got, reference):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for k in b.keys(True, True):
            assert a[k].dtype == b[k].dtype, k
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=str(k))


def test_compiled_recurrent_rollout_continues_its_carry():
    """Compiled: re-unrolling both collects' observations from the first one's stored carry with
    their reset masks gives every stored log-prob and carry (so the carry crossed the collect)."""
    env, agent, state = _recurrent_agent()
    sampler = GraphSampler(env, AotAct(agent.act, ppo.ACT_KEYS, fallback=None), RNN.num_steps)
    first = sampler.collect(state).clone()
    second = sampler.collect(state)
    assert sampler.model is not None
    both = torch.cat([first, second])
    assert both["reset"][0].all() and torch.equal(both["reset"][1:], ~both["valid"][:-1])
    assert both["episode_end"].any()
    _, rnn, _ = common.config_policy(RNN, env.spec)
    d, _, _ = rnn.unroll(state["params"], both["obs"], both["reset"], both["carry"][0])
    torch.testing.assert_close(both["logp"], common.action_dist(env.spec).log_prob(*d, both["action"]),
                               atol=1e-5, rtol=1e-5)
    for t in (1, RNN.num_steps, 2 * RNN.num_steps - 1):   # the first step of the second collect among them
        *_, carry = rnn.unroll(state["params"], both["obs"][:t], both["reset"][:t], both["carry"][0])
        keep = (~both["reset"][t]).float().unsqueeze(-1)   # the carry step t starts from: zeroed at a reset
        for k in carry.keys(True, True):
            torch.testing.assert_close(both["carry"][t][k], carry[k] * keep, atol=1e-5, rtol=1e-5, msg=str(k))


def test_errors():
    env, agent, state = _agent()
    with pytest.raises(ConfigError, match="steps a functional env"):
        GraphSampler(envs.make("CartPole-v1", 2, seed=0), agent.act, 4)


@pytest.mark.parametrize("argv, message", [
    (["r2d1"], "--sampler graph serves on-policy and row-replay algorithms; r2d1 stores sequences"),
    (["sac", "--env", "CartPole-v1"], "sac needs a continuous action space"),
    (["ppo", "--env", "Pong-v5"], "'Pong-v5' has no torch version for --sampler graph"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tmp_path):
    assert main(["train", *argv, "--sampler", "graph", "--no-compile", "--quiet", "--log-dir",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_ppo_preset_solves_cartpole_with_the_graph_sampler(tmp_path):
    """`fnrl train ppo --sampler graph`, seed 1: the preset's 100k env steps, then a final evaluation
    without exploration (10 episodes on EnvPool's CartPole) of >= 475."""
    from fnrl.train import train

    result = train("ppo", None, seed=1, log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False,
                   sampler="graph")
    assert result.history[-1]["env_steps"] <= 100_352
    assert final_evaluations(result)[0] >= 475


@pytest.mark.slow
@pytest.mark.matrix
def test_dqn_learns_cartpole_with_the_graph_sampler(tmp_path):
    """The DQN family's loop takes the graph sampler's rollouts as any other: dqn's CartPole preset,
    4 seeds vmapped, judged as the serial learning test judges it (tests/test_learning_dqn.py).
    In the matrix, as SAC's below: the graph sampler's rollouts are checked step by step against the
    functional envs and the policy above, the off-policy loop's replay through it in tests/test_resume.py."""
    from fnrl.train import train

    result = train("dqn", None, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False, sampler="graph")
    assert_most_seeds_reach(result, 475, floor=200)


@pytest.mark.slow
@pytest.mark.matrix
def test_sac_learns_pendulum_with_the_graph_sampler(tmp_path):
    """sac's Pendulum preset through the graph sampler, 4 seeds vmapped, judged as the serial
    learning test judges it (tests/test_learning_qpg.py): at most one seed below -250, none below -500."""
    from fnrl.presets import configure
    from fnrl.train import train

    config, _ = configure("sac", "Pendulum-v1")
    result = train("sac", config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False, sampler="graph")
    assert_most_seeds_reach(result, -250, floor=-500)


@pytest.mark.slow
@pytest.mark.matrix
def test_recurrent_ppo_learns_cartpole_without_velocities_with_the_graph_sampler(tmp_path):
    """tests/test_learning_recurrent.py's LSTM run through the graph sampler (eager, as there), judged
    as there: a final evaluation past what a feed-forward policy reaches on the partially observed
    fnrl/CartPoleNoVel-v1 after its 200k steps. In the matrix: the carry through the graph sampler is
    checked step by step above."""
    from fnrl.train import train

    from tests.test_learning_recurrent import LSTM_BAR, NOVEL

    result = train("ppo", NOVEL, seed=0, compile=False, quiet=True, tensorboard=False, plot=False,
                   log_dir=tmp_path / "run", sampler="graph")
    assert final_evaluations(result)[0] >= LSTM_BAR


class Walk(functional.FunctionalEnv):
    """The README's example of a user's own functional env: a walker on a line, actions 0 / 1 step
    left / right by 0.1, the episode ends past +-1 and earns 1 on the right."""

    env_id, physics_size, obs_size, num_actions = "Walk-v0", 1, 1, 2
    max_episode_steps = 50

    def initial(self, like, generator=None):
        return torch.zeros_like(like)

    def observe(self, physics):
        return physics.float()

    def transition(self, physics, action):
        x = physics + torch.where(action == 1, 0.1, -0.1).to(physics.dtype).unsqueeze(-1)
        done = x[:, 0].abs() > 1.0 - 1e-9
        return x, torch.where(done & (x[:, 0] > 0), 1.0, 0.0).to(physics.dtype), done


@pytest.mark.slow
def test_a_users_own_functional_env_trains_through_the_graph_sampler(tmp_path, monkeypatch):
    """Registered in `functional.ENVS`, an env of the user's own serves `--sampler graph`: PPO's default
    run learns to walk right: every one of the last 100 episodes earns 1, where the first episodes (a
    near-random walk) earn about half as much."""
    import dataclasses

    from fnrl.train import train

    monkeypatch.setitem(functional.ENVS, "Walk-v0", Walk)
    config = dataclasses.replace(ppo.Config(), env_id="Walk-v0", total_steps=20_000)
    result = train("ppo", config, seed=0, compile=False, quiet=True, tensorboard=False, plot=False,
                   log_dir=tmp_path / "run", sampler="graph")
    assert min(row["return_mean"] for row in result.history) < 0.75 and result.return_mean == 1.0
