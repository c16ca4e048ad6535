import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch

from fnrl import envs
from fnrl.envs.batched import EnvPoolCalls
from fnrl.errors import ConfigError
from fnrl.returns import gae
from fnrl.samplers import SerialSampler


def zero_policy(state, obs, carry, explore):
    return torch.zeros(obs.shape[0], dtype=torch.int64), {}, carry


def collect(env_id, T=8, backend="gymnasium"):
    env = envs.make(env_id, num_envs=1, seed=0, backend=backend)
    return SerialSampler(env, zero_policy, T).collect(None)


def test_terminated_episode_hand_built():
    ro = collect("fnrltest/CountTerm-v0")
    # steps: k=1,2,3(terminal) | reset step | 1,2,3(terminal) | reset step
    assert ro["obs"][:, 0, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert ro["next_obs"][:, 0, 0].tolist() == [1, 2, 3, 0, 1, 2, 3, 0]
    assert ro["valid"][:, 0].tolist() == [True, True, True, False, True, True, True, False]
    assert ro["terminated"][:, 0].tolist() == [False, False, True, False, False, False, True, False]
    assert not ro["truncated"].any()
    assert ro["reward"][:, 0].tolist() == pytest.approx([1.0, 1.1, 1.2, 0.0, 1.0, 1.1, 1.2, 0.0])
    assert ro["episode_end"][:, 0].tolist() == [False, False, True, False, False, False, True, False]
    assert ro["episode_return"][2, 0].item() == pytest.approx(3.3)
    assert ro["episode_length"][6, 0].item() == 3


def test_truncation_bootstraps_from_final_observation_termination_does_not():
    gamma = 0.5
    for env_id, terminal in (("fnrltest/CountTrunc-v0", False), ("fnrltest/CountTerm-v0", True)):
        ro = collect(env_id)
        assert ro["done"][2, 0] and ro["truncated"][2, 0] != terminal
        assert ro["next_obs"][2, 0, 0] == 3.0  # the final observation, not the reset one
        value = ro["obs"][..., 0]  # V(s) = k
        next_value = ro["next_obs"][..., 0]
        discount = gamma * (~ro["terminated"]).float()
        adv = gae(ro["reward"], value, next_value, discount, ro["done"], 1.0)
        target = adv + value
        # last step of the episode: r = 1.2, bootstrap gamma * V(final obs = 3) unless terminal
        assert target[2, 0].item() == pytest.approx(1.2 + (0.0 if terminal else gamma * 3.0))
        # first step: 1.0 + .5 * 1.1 + .25 * (1.2 + .5 * 3 if truncated)
        expected = 1.0 + 0.5 * 1.1 + 0.25 * 1.2 + (0.0 if terminal else 0.125 * 3.0)
        assert target[0, 0].item() == pytest.approx(expected)


def test_envpool_reset_step_and_truncation():
    env = envs.make("CartPole-v1", num_envs=2, seed=0, max_episode_steps=5)
    ro = SerialSampler(env, zero_policy, 12).collect(None)
    trunc = ro["truncated"] & ~ro["terminated"]
    t = int(torch.nonzero(ro["done"][:, 0])[0])
    assert not ro["valid"][t + 1, 0] and ro["valid"][: t + 1, 0].all()
    assert ro["reward"][t + 1, 0] == 0
    if trunc[t, 0]:
        assert ro["episode_length"][t, 0] == 5 and ro["episode_return"][t, 0] == 5
    # obs[t + 1] is always next_obs[t]: the adaptor's contract across resets
    assert torch.equal(ro["obs"][1:], ro["next_obs"][:-1])


def test_spec_and_dtypes():
    cheetah = envs.make("HalfCheetah-v4", num_envs=2, seed=0)
    assert cheetah.spec.action_shape == (6,) and not cheetah.spec.discrete
    out = cheetah.step(torch.zeros(2, 6))
    assert out["obs"].dtype == torch.float32 and out["obs"].shape == (2, 17)  # float64 cast to float32
    pong = envs.make("Pong-v5", num_envs=2, seed=0)
    assert pong.spec.is_atari and pong.spec.num_actions == 6 and pong.spec.obs_shape == (4, 84, 84)
    assert pong.reset()["obs"].dtype == torch.uint8


def test_unknown_env_id_is_one_line():
    with pytest.raises(ConfigError, match="unknown env id 'CartPol-v1'.*CartPole-v1"):
        envs.make("CartPol-v1")


def test_rollout_buffers_are_reused_and_carry_over():
    env = envs.make("CartPole-v1", num_envs=3, seed=0)
    sampler = SerialSampler(env, zero_policy, 4)
    first = sampler.collect(None)
    last = first["next_obs"][-1].clone()
    ptr = first["reward"].data_ptr()
    second = sampler.collect(None)
    assert second["reward"].data_ptr() == ptr  # preallocated, written in place
    assert torch.equal(second["obs"][0], last)  # the env carries on from where it stopped


def test_dict_observations_become_nested_tensordicts_and_train():
    from fnrl.algos import ppo

    config = ppo.Config(env_id="fnrltest/DictObs-v0", num_envs=2, num_steps=6, update_epochs=1)
    env = envs.make(config.env_id, config.num_envs, seed=0)
    assert env.spec.obs_shape == {"pos": (2,), "flag": (1,)}
    agent = ppo.make(config, env.spec)
    state = agent.init(0)
    ro = SerialSampler(env, agent.act, config.num_steps).collect(state)
    assert ro["obs", "pos"].shape == (6, 2, 2) and ro["next_obs", "flag"].shape == (6, 2, 1)
    assert ro["obs", "pos"][1:4, 0, 0].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert not ro["valid"][4, 0]  # the reset step after the 4-step episode
    state, metrics = agent.update(state, ro)
    assert torch.isfinite(metrics["loss"])


STEP_KEYS = ("reward", "terminated", "truncated", "done", "valid", "episode_end", "episode_return", "episode_length")


@pytest.mark.parametrize("atari", [False, True])
def test_finish_steps_equals_step_by_step_bookkeeping(atari):
    """`finish_steps` on [T, B] arrays (in chunks, carrying episodes across them, some
    without an episode end) writes what
    T per-step `_wrap` calls return: flags, valid, episode ends and lengths exactly, returns
    to float64 rounding (sums of float32 rewards: equal here), with Atari's raw score and
    game-over flag."""
    T, B = 300, 16
    rng = np.random.default_rng(0)
    reward = rng.normal(size=(T, B)).astype(np.float32)
    terminated, truncated = rng.random((T, B)) < 0.03, rng.random((T, B)) < 0.01
    score, lives_over = rng.normal(size=(T, B)) * 10, rng.random((T, B)) < 0.5
    per_step, bulk = (envs.make("CartPole-v1", B, seed=0) for _ in range(2))
    per_step.atari = bulk.atari = atari   # only the bookkeeping is exercised
    rows = [per_step._wrap(None, reward[t], terminated[t], truncated[t],
                           {"reward": score[t], "terminated": lives_over[t]}) for t in range(T)]
    out = {k: np.zeros((T, B), dtype=rows[0][k].dtype) for k in STEP_KEYS}
    out["reward"][:], out["terminated"][:], out["truncated"][:] = reward, terminated, truncated
    lo, quiet_chunks = 0, 0
    for size in itertools.cycle((37, 1, 3, 1, 2, 11)):   # short chunks without an episode end too
        hi = min(lo + size, T)
        chunk = {k: v[lo:hi] for k, v in out.items()}
        quiet_chunks += not (terminated[lo:hi] | truncated[lo:hi]).any()   # no done, so no episode end
        bulk.finish_steps(chunk, score[lo:hi], lives_over[lo:hi]) if atari else bulk.finish_steps(chunk)
        if hi == T:
            break
        lo = hi
    assert quiet_chunks >= 5
    for k in STEP_KEYS:
        expected = np.stack([r[k] for r in rows])
        if k == "episode_return":
            np.testing.assert_allclose(out[k], expected, rtol=1e-6, atol=1e-6, err_msg=k)
        else:
            np.testing.assert_array_equal(out[k], expected, err_msg=k)
    assert out["episode_end"].sum() > 50 and (out["episode_end"] != out["done"]).any() == atari
    np.testing.assert_allclose(bulk._ep_return, per_step._ep_return, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(bulk._ep_length, per_step._ep_length)


@pytest.mark.parametrize("env_id, backend", [("fnrltest/CountTerm-v0", "gymnasium"), ("CartPole-v1", "envpool")])
def test_serial_collect_bookkeeps_once_per_rollout_as_step_by_step(env_id, backend):
    """The serial sampler fills the flags and episode statistics once per collect
    (`Lane.record_raw` + `finish`); the same envs stepped with per-step bookkeeping give the
    same rollouts, across episode ends, truncations and collects."""
    def policy(state, obs, carry, explore):
        return (obs.flatten(1)[:, 0] > 0).to(torch.int64), {"value": obs.flatten(1).sum(1)}, carry

    kwargs = {"max_episode_steps": 7} if backend == "envpool" else {}
    fast, slow = (SerialSampler(envs.make(env_id, num_envs=3, seed=0, backend=backend, **kwargs), policy, 10)
                  for _ in range(2))
    for i in range(4):
        a, b = fast.collect(None), slow.collect(None)
        slow.lane.batched_bookkeeping = False
        assert fast.lane.batched_bookkeeping
        assert a.keys() == b.keys()
        for k in a.keys():
            assert torch.equal(a[k], b[k]), (i, k)
    assert a["episode_end"].any() and b["truncated"].any() == (backend == "envpool")


@pytest.mark.slow
def test_ppo_runs_on_pong(tmp_path):
    """Atari smoke test: a few PPO iterations with the Nature CNN on EnvPool's Pong-v5."""
    from fnrl.algos import ppo
    from fnrl.train import train

    config = ppo.Config(env_id="Pong-v5", num_envs=4, num_steps=32, update_epochs=1, num_minibatches=2,
                        total_steps=384, learning_rate=2.5e-4)
    result = train("ppo", config, log_dir=tmp_path / "pong", quiet=True, compile=False, log_interval=128,
                   tensorboard=False, plot=False, eval_episodes=0)   # whole Pong games: minutes
    assert result.history[-1]["env_steps"] == 384
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history)


@pytest.mark.parametrize("env_id, num_envs", [("CartPole-v1", 3), ("Pong-v5", 2), ("Pendulum-v1", 2)])
def test_envpool_direct_calls_match_envpool_wrapper(env_id, num_envs):
    """BatchedEnv steps EnvPool through its C++ send / recv (EnvPoolCalls); the same seed
    and actions through EnvPool's own gymnasium `step` give the same arrays, step for step,
    across episode ends (short CartPole episodes under constant actions) and Atari's info."""
    import envpool

    fast = envs.make(env_id, num_envs, seed=3, backend="envpool")
    assert isinstance(fast._calls, EnvPoolCalls)
    kwargs = {"episodic_life": True, "reward_clip": True} if env_id == "Pong-v5" else {}
    wrapped = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, seed=3, **kwargs)
    fast.reset()
    wrapped.reset()
    rng = np.random.default_rng(0)
    space = wrapped.action_space
    for t in range(60):
        if fast.spec.discrete:
            action = np.full(num_envs, t % 2 if env_id == "CartPole-v1" else rng.integers(space.n), np.int32)
        else:
            action = rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(space.dtype)
        obs, reward, terminated, truncated, info = wrapped.step(action)
        got = fast._calls.step(action)
        for a, b in zip((obs, reward, terminated, truncated), got[:4]):
            np.testing.assert_array_equal(a, b)
        for k, v in got[4].items():
            np.testing.assert_array_equal(info[k], v)
    assert set(got[4]) == ({"reward", "terminated"} if env_id == "Pong-v5" else set())
    fast.close()
    wrapped.close()


def _polling(env_id, num_envs, **kwargs) -> bool:
    """Whether a freshly made env polls (`BatchedEnv.poll`); the env is closed again."""
    env = envs.make(env_id, num_envs, **kwargs)
    try:
        return env.poll
    finally:
        env.close()


def test_envpool_calls_poll_only_where_a_core_is_left_over(monkeypatch):
    """`recv` polls the clock before EnvPool's recv where EnvPool's workers leave the process a core
    (fewer workers than its cores) and `$FNRL_ENV_POLL` is not 0; a polling env steps exactly as
    EnvPool's own `step`, and its running mean step time is a positive duration."""
    from fnrl.envs.batched import polls

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert polls({"num_threads": 1, "num_envs": 64})
    assert not polls({"num_threads": 2, "num_envs": 64}) and not polls({"num_threads": 0, "num_envs": 8})
    assert polls({"num_threads": 0, "num_envs": 1})   # one env: one worker
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})   # e.g. a `fnrl launch` slot of one core
    assert not polls({"num_threads": 1, "num_envs": 64})
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv(envs.POLL_VAR, "0")
    assert not polls({"num_threads": 1, "num_envs": 64})
    assert not _polling("CartPole-v1", 8, backend="envpool")
    monkeypatch.delenv(envs.POLL_VAR)
    import envpool

    env = envs.make("CartPole-v1", 8, seed=5, backend="envpool")
    assert env._calls.poll and not _polling("Pong-v5", 2)   # Atari: a worker per core
    reference = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=8, seed=5)
    env.reset()
    reference.reset()
    for t in range(300):
        action = np.full(8, (t // 3) % 2, np.int32)
        for a, b in zip(reference.step(action)[:4], env._calls.step(action)[:4]):
            np.testing.assert_array_equal(a, b)
    assert 0 < env._calls.step_s < 1
    env.poll = False   # what `fnrl.train` does where its update runs on several threads
    assert not env.poll and not env._calls.poll
    env.close()
    reference.close()
    assert not _polling("CartPole-v1", 2, backend="gymnasium")   # in-process envs never wait


@pytest.mark.parametrize("update_threads, polled", [(1, True), (2, False)])
def test_training_polls_only_with_a_single_threaded_act_and_update(monkeypatch, tmp_path, update_threads, polled):
    """`fnrl train` keeps polling where acting and the update run on one thread each; with a
    multi-thread update (idle OpenMP threads spin into the collect) its env waits sleeping."""
    from fnrl import train as training
    from fnrl.algos import ppo

    seen = set()
    recv = EnvPoolCalls.recv

    def spy(self):
        seen.add(self.poll)
        return recv(self)

    monkeypatch.setattr(EnvPoolCalls, "recv", spy)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})   # a spare core on any machine
    config = ppo.Config(num_envs=8, num_steps=16, total_steps=2 * 8 * 16)
    training.train("ppo", config, compile=False, quiet=True, tensorboard=False, plot=False,
                   log_dir=tmp_path / "run", update_threads=update_threads, eval_episodes=0)
    assert seen == {polled}


def test_polling_follows_the_step_time_and_shrugs_off_a_stall(monkeypatch):
    """On a fake clock: the mean step time converges to the env's, `recv` polls until 0.7 of it
    after `send` even when the step is done at once, and a one-off 1 s stall moves the mean by
    12.5% at most."""
    from fnrl.envs import batched

    clock = [0.0]

    def tick():   # every reading of the clock takes a microsecond
        clock[0] += 1e-6
        return clock[0]

    monkeypatch.setattr(batched, "perf_counter", tick)

    class Raw:   # EnvPool's calls as EnvPoolCalls uses them; a step is ready `duration` after send
        _spec = type("Spec", (), {"_action_spec": [(np.int32,)]})()
        duration = 100e-6

        def _from(self, action):
            return [action]

        def send(self, action):
            self.ready = clock[0] + self.duration

        _send = send

        def _recv(self):
            clock[0] = max(clock[0], self.ready)
            return [np.zeros((2, 4), np.float32), np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool)]

    raw = Raw()
    calls = EnvPoolCalls(raw, ["obs", "reward", "done", "trunc"], poll=True)
    action = np.zeros(2, np.int32)
    for _ in range(100):
        calls.step(action)
    assert calls.step_s == pytest.approx(100e-6, rel=0.05)
    mean, raw.duration = calls.step_s, 0.0
    calls.step(action)
    assert clock[0] - calls._sent >= 0.7 * mean   # polled although the step was ready at once
    mean, raw.duration = calls.step_s, 1.0
    calls.step(action)
    assert mean < calls.step_s <= 1.125 * mean + 1e-12
    raw.duration = 100e-6
    for _ in range(100):
        calls.step(action)
    assert calls.step_s == pytest.approx(100e-6, rel=0.05)


def test_envpool_threads_default_to_one_for_classic_control_only(monkeypatch):
    """Classic-control steps are cheaper than a thread hand-off: one EnvPool thread; Atari keeps
    EnvPool's default (0: one per core); an explicit num_threads wins."""
    assert envs.envpool_threads("CartPole-v1") == 1 and envs.envpool_threads("Pendulum-v1") == 1
    assert envs.envpool_threads("Pong-v5") == 0 and envs.envpool_threads("HalfCheetah-v4") == 0
    env = envs.make("CartPole-v1", 2, backend="envpool")
    assert env.raw.config["num_threads"] == 1
    env.close()
    env = envs.make("CartPole-v1", 2, num_threads=2)
    assert env.raw.config["num_threads"] == 2
    env.close()
    monkeypatch.setenv(envs.ENV_THREADS_VAR, "2")   # what `fnrl train --env-threads 2` sets for the run
    env = envs.make("CartPole-v1", 2)
    assert env.raw.config["num_threads"] == 2
    env.close()
    monkeypatch.setenv(envs.ENV_THREADS_VAR, "two")
    with pytest.raises(ConfigError, match=r"FNRL_ENV_THREADS must be a number"):
        envs.make("CartPole-v1", 2)


@pytest.mark.parametrize("env_id, num_envs", [("CartPole-v1", 1), ("Pendulum-v1", 3), ("fnrltest/DictObs-v0", 2)])
def test_in_process_envs_step_as_gymnasium_sync_vector_env(env_id, num_envs):
    """fnrl's lean in-process batch and gymnasium's SyncVectorEnv (next-step autoreset), seeded
    alike and given the same random actions, return the same arrays step for step, through
    terminations (CartPole), truncations (Pendulum's 200-step limit) and Dict observations."""
    from gymnasium.vector import AutoresetMode

    from fnrl.envs.inprocess import InProcessEnvs

    ours = InProcessEnvs(env_id, num_envs)
    ref = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP})
    flat = (lambda o: np.concatenate([o[k].reshape(num_envs, -1) for k in sorted(o)], axis=1)
            if isinstance(o, dict) else o)
    np.testing.assert_array_equal(flat(ours.reset(seed=5)[0]), flat(ref.reset(seed=5)[0]))
    ref.action_space.seed(0)
    ends = np.zeros(2, dtype=int)
    for _ in range(450):
        action = ref.action_space.sample()
        a, b = ours.step(action), ref.step(action)
        np.testing.assert_array_equal(flat(a[0]), flat(b[0]))
        assert flat(a[0]).dtype == flat(b[0]).dtype
        np.testing.assert_array_equal(a[1], b[1].astype(np.float32))
        np.testing.assert_array_equal(a[2], b[2])
        np.testing.assert_array_equal(a[3], b[3])
        ends += a[2].sum(), a[3].sum()
    assert ends[1] > 0 if env_id == "Pendulum-v1" else ends[0] > 0


def test_auto_backend_steps_a_few_classic_control_envs_in_process(monkeypatch):
    """A few classic-control envs leave EnvPool little to batch, only its thread hand-off (2-4x
    the steps): `auto` steps gymnasium's envs in-process, with the same spec; more envs, other
    families, EnvPool options or an explicit backend keep EnvPool."""
    for env_id, n in (("CartPole-v1", 1), ("Pendulum-v1", 4), ("fnrl/CartPoleNoVel-v1", 2)):
        few, pool = envs.make(env_id, n), envs.make(env_id, n, backend="envpool")
        assert (few.backend, pool.backend) == ("gymnasium", "envpool")
        assert few.spec == pool.spec
        assert few.reset()["obs"].dtype == pool.reset()["obs"].dtype
        assert set(few.step_td(torch.zeros(n, *few.spec.action_shape, dtype=few.spec.action_dtype)).keys()) == \
            set(pool.step_td(torch.zeros(n, *pool.spec.action_shape, dtype=pool.spec.action_dtype)).keys())
    assert envs.make("CartPole-v1", envs.IN_PROCESS_MAX_ENVS + 1).backend == "envpool"
    assert envs.make("CartPole-v1", 1, num_threads=1).backend == "envpool"
    assert not envs.steps_in_process("HalfCheetah-v4", 1, {}) and not envs.steps_in_process("Pong-v5", 1, {})
    monkeypatch.setenv(envs.ENV_THREADS_VAR, "1")
    assert envs.make("CartPole-v1", 1).backend == "envpool"
