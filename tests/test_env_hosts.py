"""IMPALA's env hosts over torch.distributed (`fnrl train impala --actor-hosts N`, SEED RL): the
trajectories assembled on the learner, equality with the one-machine central sampler, a run, and
learning. Killing a host or the learner, and torchrun, are in tests/test_actor_hosts.py.
"""
import dataclasses
import json
import time

import pytest
import torch

from fnrl import envs
from fnrl.algos import impala
from fnrl.distributed.env_hosts import EnvHosts, _Trajectory, _request
from fnrl.errors import SamplerError
from fnrl.samplers.central import CentralSampler, trajectory_batch, trajectory_buffers
from fnrl.train import train
from fnrl.train_central import _build_env_host
from tests.learning import final_evaluations

SPEC = envs.env_spec("CartPole-v1")


def _step(obs: float, reward: float, valid: bool = True, done: bool = False) -> dict:
    step = {"reward": torch.tensor([reward]), "terminated": torch.tensor([done]), "truncated": torch.tensor([False]),
            "done": torch.tensor([done]), "valid": torch.tensor([valid]), "episode_end": torch.tensor([done]),
            "episode_return": torch.tensor([reward]), "episode_length": torch.tensor([1.0])}
    return _request(torch.full((1, 1), obs), step)


def test_a_trajectory_is_assembled_from_requests_and_replies_as_an_actor_fills_it():
    """T = 2, B = 1: obs 0 -> action 10 -> (obs 1, reward 1) -> action 11 -> (obs 2, reward 2, done)
    completes [obs 0, 1 | next 1, 2]; the next one starts at obs 2."""
    reply = {"action": torch.zeros(1, dtype=torch.int64), "logp": torch.zeros(1)}
    building = _Trajectory(trajectory_buffers(2, 1, (1,), torch.float32, reply))
    building.begin(torch.zeros(1, 1))
    building.acted({"action": torch.tensor([10]), "logp": torch.tensor([-0.1])}, 3, torch.tensor([True]))
    assert building.stepped(_step(1.0, 1.0)) is None
    building.acted({"action": torch.tensor([11]), "logp": torch.tensor([-0.2])}, 4, torch.tensor([False]))
    full = building.stepped(_step(2.0, 2.0, done=True))
    batch = trajectory_batch([full], "cpu")
    assert batch.batch_size == torch.Size([2, 1])
    assert batch["obs"].flatten().tolist() == [0.0, 1.0] and batch["next_obs"].flatten().tolist() == [1.0, 2.0]
    assert batch["action"].flatten().tolist() == [10, 11] and batch["version"].flatten().tolist() == [3, 4]
    assert batch["reward"].flatten().tolist() == [1.0, 2.0] and batch["done"].flatten().tolist() == [False, True]
    assert batch["reset"].flatten().tolist() == [True, False]
    torch.testing.assert_close(batch["logp"].flatten(), torch.tensor([-0.1, -0.2]))
    assert building.t == 0 and float(building.buffers["obs"][0]) == 2.0


def _trajectories(sampler, n: int) -> list:
    try:
        sampler.start()
        return [sampler.get(1) for _ in range(n)]
    finally:
        sampler.close()


@pytest.mark.parametrize("core", ["none", "lstm"])
def test_an_env_host_gives_the_trajectories_of_the_one_machine_actor(core):
    """One host, a fixed greedy policy: the trajectories assembled on the learner from the host's
    requests equal those the one-machine central sampler's actor fills (episode ends and the
    recurrent carry included)."""
    config = impala.Config(num_envs=4, num_steps=10, hidden=(16,), core=core, core_size=8)
    agent = impala.make(config, SPEC)
    state = agent.init(0)
    shapes = dict(horizon=config.num_steps, obs_shape=SPEC.obs_shape, obs_dtype=SPEC.obs_dtype, explore=False)
    local = _trajectories(CentralSampler(config.env_id, config.num_envs, 1, agent.act, state, seed=3, **shapes), 4)
    hosted = _trajectories(EnvHosts(impala.make(config, SPEC).act, state, hosts=1, num_envs=config.num_envs,
                                    spawn=(_build_env_host, (config, 3, 1), 3, 1), **shapes), 4)
    assert bool(local[-1]["done"].any()), "no episode ended: the test would not cover resets"
    for mine, theirs in zip(hosted, local):
        assert set(mine.keys(True, True)) == set(theirs.keys(True, True))
        for key in theirs.keys(True, True):
            assert torch.equal(mine[key], theirs[key]), key


def test_two_env_hosts_feed_the_learner(tmp_path):
    """Both hosts are IMPALA's actors: every update's trajectories came from them, the rows log them."""
    config = dataclasses.replace(impala.Config(), total_steps=3_200, hidden=(16,))
    result = train("impala", config, seed=0, log_dir=tmp_path / "run", compile=False, quiet=True, log_interval=800,
                   tensorboard=False, plot=False, actor_hosts=2, eval_episodes=2)
    last = result.history[-1]
    assert last["env_steps"] == 3_200 and last["updates"] == 3_200 // (10 * 8 * 2)
    assert (last["actors"], last["actors_lost"], last["discarded"]) == (2, 0, 0)
    assert 1.0 <= last["inference_batch"] <= 2.0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["actor_hosts"] == 2 and saved["config"]["num_actors"] == 2


@pytest.mark.slow
@pytest.mark.matrix   # three processes on the two cores for about 70 s a seed: CI's time goes to the other tests
def test_impala_learns_cartpole_from_two_env_hosts(tmp_path):
    """IMPALA's CartPole preset with its actors as two env hosts over loopback, 300k env steps: the
    final evaluation without exploration reaches 475 on each of seeds 0, 1 and 2."""
    finals = []
    for seed in range(3):
        result = train("impala", seed=seed, log_dir=tmp_path / f"s{seed}", compile=False, quiet=True,
                       tensorboard=False, plot=False, actor_hosts=2)
        finals.append(final_evaluations(result)[0])
    assert min(finals) >= 475, finals


def test_the_learner_answers_no_host_while_its_trajectory_queue_is_full():
    """Back-pressure: nobody pops trajectories, so once the queue holds its bound the host waits
    for its actions and no further requests are served."""
    config = impala.Config(num_envs=2, num_steps=4, hidden=(8,))
    agent = impala.make(config, SPEC)
    hosts = EnvHosts(agent.act, agent.init(0), hosts=1, num_envs=2, horizon=4, obs_shape=SPEC.obs_shape,
                     obs_dtype=SPEC.obs_dtype, num_slots=3, spawn=(_build_env_host, (config, 0, 1), 0, 1))
    try:
        hosts.start()
        deadline = time.monotonic() + 120
        while hosts._full.qsize() < 2:   # the bound: num_slots - 1 live host
            assert time.monotonic() < deadline, "no trajectories"
            time.sleep(0.05)
        time.sleep(1.0)
        assert hosts._full.qsize() == 2
        assert hosts.requests == 2 * 4 + 1   # two trajectories, and the request that completed the second
        assert hosts.get(1).batch_size == torch.Size([4, 2])
        while hosts.requests == 2 * 4 + 1:   # a slot is free: serving resumes
            assert time.monotonic() < deadline, "serving did not resume"
            time.sleep(0.05)
    finally:
        hosts.close()


def _failing_build(*args):
    raise RuntimeError("no env here")


def test_a_host_failing_before_the_run_starts_stops_it_at_once_with_its_error():
    config = impala.Config(num_envs=2, hidden=(8,))
    agent = impala.make(config, SPEC)
    hosts = EnvHosts(agent.act, agent.init(0), hosts=2, num_envs=2, horizon=4, obs_shape=SPEC.obs_shape,
                     obs_dtype=SPEC.obs_dtype, spawn=(_failing_build, (), 0, 1))
    with pytest.raises(SamplerError, match="failed before the run started: actor [12]: RuntimeError: no env here"):
        try:
            hosts.start()
        finally:
            hosts.close()
    assert all(p.exitcode is not None for p in hosts.group.processes.values())
