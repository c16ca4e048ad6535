"""Tiered execution (`fnrl.accel.tiered`): eager steps at once, compiled ones from a builder process.

Building PPO's compiled steps for the small CartPole config below takes a builder process tens of
seconds with an empty cache. Each test builds or lists what it needs itself (tests run side by
side and in any order), with its builder folders in its own temporary folder."""
import csv
import dataclasses
import sys
import tempfile
import time

import pytest
import torch

from fnrl import envs, samplers
from fnrl.accel import aot, tiered
from fnrl.accel.options import AccelOptions
from fnrl.algos import dqn, ppo
from fnrl.errors import ConfigError
from fnrl.presets import configure
from fnrl.run.threads import intra_op_threads
from fnrl.train import train

T, B = 16, 4
# Steps where rounding cannot decide: no sample near the clip range's edge (a small learning rate),
# and no near-zero gradient that Adam's normalized step would blow up to a learning rate (adam_eps)
CONFIG = dataclasses.replace(configure("ppo")[0], num_envs=B, num_steps=T, num_minibatches=2, update_epochs=2,
                             total_steps=4 * T * B, adam_eps=1e-3, learning_rate=1e-4, anneal_clip=False)
QUIET = dict(quiet=True, plot=False, tensorboard=False, eval_episodes=0, log_interval=T * B)
# DQN's CartPole preset, small: 16 env steps an iteration, updates from the third one (4 of 16 rows)
DQN = dataclasses.replace(configure("dqn")[0], hidden=(16,), num_envs=B, num_steps=4, batch_size=16, buffer_size=1000,
                          learning_starts=32, total_steps=8 * 16, learning_rate=1e-4)


@pytest.fixture
def builders(tmp_path, monkeypatch):
    """The folder this test's builders work in (`tempfile`'s folder, for this test only)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setattr(tiered, "MIN_EAGER_S", 0.0)
    return folder


def _unlist(config, module=ppo) -> None:
    """Forget every listing of `config`'s steps (an earlier run of the suite's, say)."""
    spec = envs.make(config.env_id, config.num_envs, seed=list(range(config.num_envs))).spec
    run = tiered._run_key((module, config, spec, AccelOptions()))
    for listing in (aot.cache_dir() / "tiers").glob(f"{run}-*.json"):
        listing.unlink(missing_ok=True)


def _steps(sampler, state, env_steps: int):
    rollout = sampler.collect(state)
    state["env_steps"].add_(env_steps)
    return rollout


def _assert_close(a, b, atol=1e-6):
    for key in a.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(a.get(key), b.get(key), atol=atol, rtol=1e-4, msg=lambda m: f"{key}: {m}")


def _drive(config, eager=None, iterations: int = 6, wait_at: int = 2):
    """Train a TieredAgent by hand (beside `eager`, updated from the same states on the same
    rollouts, compared at every update); wait for the builder before update `wait_at`. One torch
    thread, as `train` acts and updates this config (the models are built for their threads)."""
    with intra_op_threads(1):
        return _drive_on_one_thread(config, eager, iterations, wait_at)


def _drive_on_one_thread(config, eager, iterations: int, wait_at: int):
    env = envs.make(config.env_id, B, seed=list(range(B)))
    agent = tiered.TieredAgent(ppo, config, env.spec, AccelOptions())
    state = agent.init(0)
    sampler = samplers.make("serial", env, agent.act, T)
    try:
        for i in range(iterations):
            if i == wait_at and agent._builder is not None:
                assert agent._builder.wait(timeout=900) == 0
            rollout = _steps(sampler, state, T * B)
            before = state.clone()
            state, metrics = agent.update(state, rollout)
            if eager is not None:
                state_e, metrics_e = eager.update(before, rollout.clone())
                _assert_close(state_e, state)
                _assert_close(metrics_e, metrics)
                assert agent.tier == ("eager" if i < wait_at else "compiled")
        return agent, state, env
    finally:
        agent.close()


def test_the_builder_s_steps_compute_the_eager_ones_and_are_listed(builders, monkeypatch):
    """Beside an eager agent on the same rollouts: equal states before and after the switch,
    which comes after the update during which the builder finished; acting draws alike."""
    monkeypatch.setattr(tiered, "_listed", lambda key: None)   # built here even where listed before
    spec = envs.make(CONFIG.env_id, 1, seed=[0]).spec
    eager = ppo.make(CONFIG, spec)
    agent, state, env = _drive(CONFIG, eager)
    assert agent.switched_at == 3 * T * B
    obs = env.reset()["obs"]
    torch.manual_seed(5)
    action, extras, _ = agent.act(state, obs)
    torch.manual_seed(5)
    action_e, extras_e, _ = eager.act(state, obs, None, True)
    assert torch.equal(action, action_e)
    torch.testing.assert_close(extras["logp"], extras_e["logp"])
    monkeypatch.undo()
    assert tiered._listed(agent._key) is not None
    assert not list(builders.iterdir())   # the builder's folder is gone


def test_a_tiered_run_switches_at_its_first_update_and_equals_the_eager_and_compiled_runs(builders, tmp_path):
    """With listed steps a run switches after its first update; progress.csv's tier column says
    which steps each row's update ran; the final state is the eager run's and the compiled run's
    to float tolerance."""
    _drive(CONFIG, iterations=3)   # listed (or found listed)
    results = {mode: train("ppo", CONFIG, compile=mode, log_dir=tmp_path / str(mode), **QUIET)
               for mode in ("tiered", False, True)}
    tiers = {mode: [r["tier"] for r in csv.DictReader(open(tmp_path / str(mode) / "progress.csv"))]
             for mode in results}
    assert tiers == {"tiered": ["eager"] + ["compiled"] * 3, False: ["eager"] * 4, True: ["compiled"] * 4}
    _assert_close(results[False].state, results["tiered"].state)
    _assert_close(results[True].state, results["tiered"].state)


def test_a_run_that_ends_first_leaves_its_builder_to_list_the_steps_for_the_next_run(builders, tmp_path):
    config = dataclasses.replace(CONFIG, total_steps=3 * T * B)
    _unlist(config)
    train("ppo", config, compile="tiered", log_dir=tmp_path / "first", **QUIET)
    _wait_for_detached_builder(builders)
    train("ppo", config, compile="tiered", log_dir=tmp_path / "second", **QUIET)
    tiers = [r["tier"] for r in csv.DictReader(open(tmp_path / "second" / "progress.csv"))]
    assert tiers == ["eager", "compiled", "compiled"]


def _wait_for_detached_builder(builders) -> None:
    (folder,) = builders.iterdir()   # the builder still runs
    deadline = time.monotonic() + 900
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not folder.exists()   # done, listed, and its folder removed


def test_an_off_policy_run_switches_before_its_updates_and_equals_the_eager_and_compiled_runs(builders, tmp_path):
    """DQN: the first run starts its builder one eager iteration after updates begin and ends first;
    the next run switches before its first updates to the listed acting, fused learner step and
    replay write; its final state is the eager run's and the compiled run's to float tolerance."""
    _unlist(DQN, dqn)
    quiet = {**QUIET, "log_interval": 16}
    train("dqn", DQN, compile="tiered", log_dir=tmp_path / "first", **quiet)
    _wait_for_detached_builder(builders)
    results = {mode: train("dqn", DQN, compile=mode, log_dir=tmp_path / str(mode), **quiet)
               for mode in ("tiered", False, True)}
    tiers = [r["tier"] for r in csv.DictReader(open(tmp_path / "tiered" / "progress.csv"))]
    assert tiers == ["eager"] + ["compiled"] * 7   # the first iteration makes no update
    _assert_close(results[False].state, results["tiered"].state)
    _assert_close(results[True].state, results["tiered"].state)


def test_a_run_ended_by_an_error_stops_its_builder(builders, tmp_path):
    class Fails:
        def on_log(self, event):
            if event.env_steps >= 3 * T * B:   # the builder started after the first update
                raise RuntimeError("a user's callback failed")

    config = dataclasses.replace(CONFIG, total_steps=50 * T * B)
    _unlist(config)
    with pytest.raises(RuntimeError, match="callback failed"):
        train("ppo", config, compile="tiered", log_dir=tmp_path / "run", callbacks=[Fails()], **QUIET)
    assert not list(builders.iterdir())   # stopped, and its folder removed (a detached builder keeps it)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_failed_build_leaves_the_run_eager_with_one_warning(builders, tmp_path, monkeypatch, algo):
    monkeypatch.setattr(tiered, "_builder_command",
                        lambda folder: [sys.executable, "-c", "import sys; sys.exit('no C++ compiler here')"])
    module, config = (ppo, CONFIG) if algo == "ppo" else (dqn, DQN)
    config = dataclasses.replace(config, total_steps=300 * T * B)   # long enough for the builder to end first
    _unlist(config, module)
    with pytest.warns(UserWarning, match="no C.. compiler here.*goes on with the eager ones") as caught:
        train(algo, config, compile="tiered", log_dir=tmp_path / "run", **QUIET)
    assert len([w for w in caught if "compiled steps" in str(w.message)]) == 1
    assert {r["tier"] for r in csv.DictReader(open(tmp_path / "run" / "progress.csv"))} == {"eager"}
    assert not list(builders.iterdir())   # the builder's folder is gone


def test_tiering_applies_to_single_feed_forward_runs_on_the_cpu():
    spec = envs.make(CONFIG.env_id, 1, seed=[0]).spec
    options = dict(single=True, sampler="serial", cuda_graphs=False)
    accel = AccelOptions()
    assert tiered.applies(ppo, CONFIG, spec, "cpu", accel, **options)
    assert not tiered.applies(ppo, dataclasses.replace(CONFIG, core="lstm"), spec, "cpu", accel, **options)
    assert not tiered.applies(ppo, CONFIG, spec, "cpu", dataclasses.replace(accel, ahead_of_time=False), **options)
    assert not tiered.applies(ppo, CONFIG, spec, "cpu", accel, **{**options, "single": False})
    assert not tiered.applies(ppo, CONFIG, spec, "cpu", accel, **{**options, "sampler": "graph"})
    assert not tiered.applies(ppo, CONFIG, dataclasses.replace(spec, obs_shape={"a": (2,)}), "cpu", accel, **options)
    from fnrl.algos import r2d1

    assert tiered.applies(dqn, dqn.Config(), spec, "cpu", accel, **options)   # the fused learner step's runs
    assert not tiered.applies(dqn, dqn.Config(), spec, "cpu", dataclasses.replace(accel, fused_learner=False),
                              **options)
    assert not tiered.applies(dqn, dqn.Config(), dataclasses.replace(spec, is_atari=True), "cpu", accel, **options)
    assert not tiered.applies(r2d1, r2d1.Config(), spec, "cpu", accel, **options)   # sequence replay


def test_compile_takes_true_false_or_tiered(tmp_path):
    with pytest.raises(ConfigError, match="compile must be True, False or 'tiered'"):
        train("ppo", CONFIG, compile="yes", log_dir=tmp_path / "run", **QUIET)
    assert not (tmp_path / "run").exists()
