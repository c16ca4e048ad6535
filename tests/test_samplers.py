"""The alternating and parallel samplers give the serial sampler's rollout; the registry,
the options' errors and the parallel sampler's failure handling."""
import os
import signal
import sys
import threading
import time

import pytest
import torch

from fnrl import envs, samplers
from fnrl.algos import ppo
from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.samplers.parallel import ParallelSampler, SamplerError

FF = ppo.Config(num_envs=4, num_steps=50)
RNN = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", num_envs=4, num_steps=30, core="lstm", core_size=8, hidden=(8,))


def _rollouts(name, config, collects=2, seed=3, explore=False, **options):
    """`collects` rollouts of PPO's deterministic (explore=False) policy through sampler `name`
    (EnvPool envs: the alternating sampler's groups are EnvPools)."""
    env = envs.make(config.env_id, config.num_envs, seed=seed, backend="envpool")
    agent = ppo.make(config, env.spec)
    state = agent.init(1)   # a policy whose greedy episodes end within the collects
    sampler = samplers.make(name, env, agent.act, config.num_steps, agent=("ppo", config), **options)
    try:
        return [sampler.collect(state, explore=explore).clone() for _ in range(collects)], sampler
    finally:
        sampler.close()


def _assert_same(a, b):
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for k in a.keys(True, True):
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.fixture(scope="module")
def serial_ff():
    return _rollouts("serial", FF)[0]


@pytest.mark.parametrize("name, options", [("alternating", {}), ("parallel", {"workers": 2})])
def test_same_rollouts_as_serial_feed_forward(name, options, serial_ff):
    """Same seeds and a deterministic policy: identical per-env trajectories, in the same columns,
    across two collects (so obs[0] of the second is obs[T] of the first) and several episode ends."""
    rollouts, sampler = _rollouts(name, FF, **options)
    assert serial_ff[0]["episode_end"].any() and serial_ff[1]["valid"].logical_not().any()
    for a, b in zip(rollouts, serial_ff):
        _assert_same(a, b)
    ro = sampler.rollout
    assert ro["next_obs"][0].data_ptr() == ro["obs"][1].data_ptr()   # next_obs[t] is obs[t + 1]


@pytest.mark.parametrize("name, options", [("alternating", {}), ("parallel", {"workers": 2})])
def test_same_rollouts_as_serial_recurrent(name, options):
    """The recurrent carry protocol: per-env carry, reset mask and stored carries equal the serial ones."""
    serial, _ = _rollouts("serial", RNN)
    rollouts, _ = _rollouts(name, RNN, **options)
    assert serial[0]["reset"][1:].any()
    for a, b in zip(rollouts, serial):
        _assert_same(a, b)


def test_parallel_workers_read_the_learners_latest_state():
    """Workers act on the state of the latest `collect` call (shared memory, copied each time)."""
    env = envs.make("CartPole-v1", 4, seed=0)
    sampler = ParallelSampler(env, _parity_policy, 5, workers=2)
    try:
        state = _counter_state()
        for k in range(3):
            state["env_steps"] += 1
            time.sleep(2.5 * (k == 1))   # idle workers keep waiting (they poll the learner's pid each second)
            ro = sampler.collect(state)
            assert (ro["action"] == (k + 1) % 2).all()
            assert ro["extras_seen"].eq(k + 1).all()
        assert "opt_state" not in sampler._shared_state.keys()   # workers get what acting may read
    finally:
        sampler.close()
    assert not any(p.is_alive() for p in sampler._procs)


def _counter_state():
    from tensordict import TensorDict

    return TensorDict({"env_steps": torch.zeros((), dtype=torch.int64), "opt_state": torch.zeros(3)}, [])


def _parity_policy(state, obs, carry, explore):
    n = obs.shape[0]
    return (state["env_steps"] % 2).expand(n).clone(), {"extras_seen": state["env_steps"].expand(n).clone()}, None


def _failing_policy(state, obs, carry, explore):
    if state["env_steps"] > 1:
        raise RuntimeError("policy exploded")
    return _parity_policy(state, obs, carry, explore)


def _slow_policy(state, obs, carry, explore):
    time.sleep(0.002)
    return _parity_policy(state, obs, carry, explore)


def test_parallel_worker_killed_mid_collect_raises_and_leaves_no_process():
    env = envs.make("CartPole-v1", 4, seed=0)
    sampler = ParallelSampler(env, _slow_policy, 100_000, workers=2, timeout=60)
    state = _counter_state()
    victim = sampler._procs[1]
    sampler._first(state, True)   # workers hold the shared rollout; the next collect is the long one
    threading.Timer(1.0, os.kill, (victim.pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(SamplerError, match=r"worker 1 .*exit code -9.* died during 'collect'"):
        sampler.collect(state)
    assert time.monotonic() - start < 30
    assert not any(p.is_alive() for p in sampler._procs)


def test_parallel_worker_exception_is_reported_with_its_traceback():
    env = envs.make("CartPole-v1", 2, seed=0)
    sampler = ParallelSampler(env, _failing_policy, 4, workers=2)
    state = _counter_state()
    sampler.collect(state)
    state["env_steps"] += 5
    with pytest.raises(SamplerError, match="(?s)failed during 'collect'.*policy exploded"):
        sampler.collect(state)
    assert not any(p.is_alive() for p in sampler._procs)


def test_parallel_collect_timeout_raises():
    env = envs.make("CartPole-v1", 2, seed=0)
    sampler = ParallelSampler(env, _slow_policy, 100_000, workers=1, timeout=3.0)
    with pytest.raises(SamplerError, match="no answer to .* within 3 s"):
        sampler.collect(_counter_state())
    assert not any(p.is_alive() for p in sampler._procs)


def test_registry_and_option_errors():
    with pytest.raises(ConfigError, match="unknown sampler 'fast'; choose one of: serial, alternating, parallel"):
        samplers.load("fast")
    env = envs.make("CartPole-v1", 3, seed=0)
    with pytest.raises(ConfigError, match="--num-envs must be even"):
        samplers.make("alternating", env, _parity_policy, 4)
    with pytest.raises(ConfigError, match="takes no option workers"):
        samplers.make("serial", env, _parity_policy, 4, workers=2)
    with pytest.raises(ConfigError, match="--sampler-workers 2 must be at least 1 and divide --num-envs 3"):
        samplers.make("parallel", env, _parity_policy, 4, workers=2)
    gym_env = envs.make("fnrltest/CountTerm-v0", 2, seed=0)
    with pytest.raises(ConfigError, match="needs an EnvPool task"):
        samplers.make("alternating", gym_env, _parity_policy, 4)
    env.close()
    gym_env.close()


@pytest.mark.parametrize("argv, message", [
    (["--sampler", "fast"], "unknown sampler 'fast'"),
    (["--sampler", "parallel", "--sampler-workers", "3"], "must be at least 1 and divide --num-envs 8"),
    (["--sampler", "alternating", "--sampler-workers", "2"], "takes no option workers"),
])
def test_cli_sampler_errors_are_one_line(argv, message, capsys, tmp_path):
    assert main(["train", "ppo", "--no-compile", "--quiet", "--log-dir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_parallel_spawn_start_method():
    """The "spawn" start method (fresh interpreters) gives the same rollout as fork."""
    fork, _ = _rollouts("parallel", FF, collects=1, workers=2)
    spawn, _ = _rollouts("parallel", FF, collects=1, workers=2, start_method="spawn")
    _assert_same(fork[0], spawn[0])


_ORPHAN_SCRIPT = """
import sys, time
from fnrl import envs
from fnrl.samplers.parallel import ParallelSampler
from tests.test_samplers import _parity_policy, _counter_state
if __name__ == "__main__":
    sampler = ParallelSampler(envs.make("CartPole-v1", 2, seed=0), _parity_policy, 4, workers=2)
    sampler.collect(_counter_state())
    print(" ".join(str(p.pid) for p in sampler._procs), flush=True)
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_parallel_workers_exit_when_the_learner_is_killed(tmp_path):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=root,
                            env={**os.environ, "PYTHONPATH": root})
    try:
        import select

        ready, _, _ = select.select([proc.stdout], [], [], 180)   # never hang: the script may fail to start
        pids = [int(p) for p in proc.stdout.readline().split()] if ready else []
    finally:
        proc.kill()
        proc.wait(30)
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_running(p) for p in pids)
