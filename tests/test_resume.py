"""`--resume` continues a run from its checkpoint.

Every checkpoint holds the parameters, optimizer, normalizer statistics, counters and RNG; an
off-policy run's also holds its replay buffer (up to `fnrl.replay.snapshot.CHECKPOINT_BYTES`) and,
the envs themselves (mid-episode), with a recurrent policy's carry, where they can be snapshot: the
graph sampler's tensors and the serial sampler's in-process gymnasium envs. Such a run (one seed or
vmapped seeds), stopped after a checkpoint and resumed, ends with the parameters of a run that never
stopped, bit for bit. EnvPool cannot snapshot its envs: those runs resume in fresh episodes.
"""
import dataclasses
import warnings

import pytest
import torch

from fnrl import train as training
from fnrl.loops import off_policy, serial
from fnrl.replay import snapshot as replay_snapshot
from fnrl.run.checkpoint import config_from_json
from fnrl.algos import default_config, dqn, ppo, qpg

PPO = ppo.Config(num_envs=4, num_steps=16, total_steps=4 * 4 * 16)   # 4 iterations; episodes span them
PPO_LSTM = ppo.Config(env_id="fnrl/CartPoleNoVel-v1", num_envs=4, num_steps=16, total_steps=4 * 4 * 16,
                      core="lstm", core_size=8, hidden=(8,))
DQN = dqn.Config(total_steps=4 * 80, learning_starts=80, num_envs=4, num_steps=20, batch_size=16,
                 buffer_size=1_000, replay_ratio=0.25)
SAC = dataclasses.replace(default_config("sac"), env_id="Pendulum-v1", total_steps=4 * 64, learning_starts=64,
                          num_envs=4, num_steps=16, batch_size=16, buffer_size=1_000, hidden=(16, 16))
RUNS = {"ppo": ("ppo", PPO, {}), "ppo-lstm": ("ppo", PPO_LSTM, {}), "dqn": ("dqn", DQN, {}), "sac": ("sac", SAC, {}),
        "ppo-2-seeds": ("ppo", PPO, {"num_seeds": 2}), "dqn-2-seeds": ("dqn", DQN, {"num_seeds": 2})}


def _leaves(state):
    return {k: v for k, v in state.items(include_nested=True, leaves_only=True) if torch.is_tensor(v)}


def _same(a, b) -> bool:
    a, b = _leaves(a), _leaves(b)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _stop_after_checkpoint(monkeypatch, n: int = 1):
    """Make `train` stop (KeyboardInterrupt) right after its n-th checkpoint; returns the undo."""
    save = serial.save_checkpoint
    written = []

    def save_then_stop(path, payload):
        save(path, payload)
        written.append(path)
        if len(written) == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(serial, "save_checkpoint", save_then_stop)
    return lambda: monkeypatch.setattr(serial, "save_checkpoint", save)


@pytest.mark.parametrize("sampler", ["graph", "serial"])
@pytest.mark.parametrize("run", RUNS, ids=list(RUNS))
def test_a_run_stopped_and_resumed_ends_as_one_that_never_stopped(run, sampler, tmp_path, monkeypatch):
    """Stopped after its checkpoint at half the run and resumed: the final state (parameters,
    optimizer, statistics, counters) equals the uninterrupted run's, through the graph sampler's
    tensor envs and the serial sampler's in-process gymnasium envs (these few classic-control envs
    step in-process, `fnrl.envs.steps_in_process`). The same stop resumed from fresh episodes and
    an empty replay, as an EnvPool run would, ends elsewhere."""
    name, config, seeds = RUNS[run]
    options = dict(compile=False, quiet=True, tensorboard=False, plot=False, sampler=sampler)
    half = config.total_steps // 2

    whole = training.train(name, config, seed=3, log_dir=tmp_path / "whole", checkpoint_every=half, **seeds,
                           **options)
    for folder in ("stopped", "forgetful"):
        restore = _stop_after_checkpoint(monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            training.train(name, config, seed=3, log_dir=tmp_path / folder, checkpoint_every=half, **seeds,
                           **options)
        restore()
    ckpt = training.load_checkpoint(tmp_path / "forgetful")
    assert ckpt["counters"]["env_steps"] == half and ckpt["sampler"] == sampler
    assert ckpt["sampler_state"] is not None
    assert (ckpt.get("replay") is not None) == (name != "ppo")
    forgotten = {**ckpt, "sampler_state": None, "replay": None}   # as an EnvPool run resumes
    training.save_checkpoint(tmp_path / "forgetful" / training.CHECKPOINT, forgotten)

    again = {k: v for k, v in options.items() if k != "sampler"}   # the checkpoint names its sampler
    resumed = training.train(name, None, resume=tmp_path / "stopped", **again)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the empty replay's warning
        forgetful = training.train(name, None, resume=tmp_path / "forgetful", **again)
    assert _same(whole.state, resumed.state)
    assert not _same(whole.state, forgetful.state)
    assert [r["env_steps"] for r in resumed.history] == [r["env_steps"] for r in whole.history]


def test_an_off_policy_run_resumes_with_its_replay_and_says_when_it_cannot(tmp_path, monkeypatch):
    """EnvPool envs start fresh episodes on resume, but the replay buffer comes back whole (the rows
    written so far, the cursor, the update credit); a checkpoint without one (over the size limit)
    resumes with an empty replay and one warning saying so."""
    options = dict(compile=False, quiet=True, tensorboard=False, plot=False)
    config = dataclasses.replace(DQN, num_envs=8)   # more envs than step in-process: EnvPool's
    half, rows = config.total_steps // 2, config.total_steps // 2 // config.num_envs
    restore = _stop_after_checkpoint(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        training.train("dqn", config, seed=0, log_dir=tmp_path / "run", checkpoint_every=half, **options)
    restore()
    ckpt = training.load_checkpoint(tmp_path / "run")
    assert ckpt["sampler_state"] is None and ckpt["replay"].steps_written == rows
    seen = []
    resumed_replay = off_policy.resumed_replay

    def spy(*args):
        replay, credit = resumed_replay(*args)
        seen.append((replay.steps_written, credit))
        return replay, credit

    monkeypatch.setattr(off_policy, "resumed_replay", spy)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*replay")   # no empty-replay warning
        training.train("dqn", None, resume=tmp_path / "run", **options)
    monkeypatch.setattr(off_policy, "resumed_replay", resumed_replay)
    assert seen == [(rows, ckpt["update_credit"])]

    monkeypatch.setattr(replay_snapshot, "CHECKPOINT_BYTES", 0)
    restore = _stop_after_checkpoint(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        training.train("dqn", config, seed=0, log_dir=tmp_path / "big", checkpoint_every=half, **options)
    restore()
    assert training.load_checkpoint(tmp_path / "big")["replay"] is None
    with pytest.warns(UserWarning, match=r"holds no replay buffer .* the resumed run's replay starts empty"):
        training.train("dqn", None, resume=tmp_path / "big", **options)


@pytest.mark.slow
def test_a_compiled_graph_sampler_run_resumes_exactly(tmp_path, monkeypatch):
    """The same with `fnrl train ppo --sampler graph`'s compiled models (the rollout model draws from
    Inductor's generator, seeded from torch's global one: the checkpoint's RNG). The default run,
    checkpointing every 2 iterations: stopped at its second checkpoint, and stopped at its first,
    resumed and stopped at its next. Its models are the graph sampler's learning test's (one
    compile, shared through the package cache), and the resumed run's are too."""
    options = dict(compile=True, quiet=True, tensorboard=False, plot=False, sampler="graph")
    every = 2 * ppo.Config().num_envs * ppo.Config().num_steps

    def stopped_at_checkpoint(n, **kwargs):
        restore = _stop_after_checkpoint(monkeypatch, n)
        with pytest.raises(KeyboardInterrupt):
            training.train("ppo", **kwargs, **options)
        restore()

    stopped_at_checkpoint(2, config=None, seed=3, log_dir=tmp_path / "whole", checkpoint_every=every)
    stopped_at_checkpoint(1, config=None, seed=3, log_dir=tmp_path / "resumed", checkpoint_every=every)
    stopped_at_checkpoint(1, resume=tmp_path / "resumed", checkpoint_every=every)
    whole, resumed = (training.load_checkpoint(tmp_path / d) for d in ("whole", "resumed"))
    assert whole["counters"]["env_steps"] == resumed["counters"]["env_steps"] == 2 * every
    assert _same(whole["state"], resumed["state"])


def test_a_checkpoint_whose_state_does_not_fit_stops_with_one_line(tmp_path, capsys):
    from fnrl.cli import main

    training.train("ppo", PPO, seed=0, log_dir=tmp_path / "run", compile=False, quiet=True, tensorboard=False,
                   plot=False)
    ckpt = training.load_checkpoint(tmp_path / "run")
    training.save_checkpoint(tmp_path / "run" / training.CHECKPOINT, {**ckpt, "state": ckpt["state"].exclude(("params", "critic"))})
    assert main(["train", "ppo", "--resume", str(tmp_path / "run"), "--no-compile", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not fit this fnrl version's state" in err and len(err.splitlines()) == 1


def test_a_finished_run_is_extended_by_total_steps_and_nothing_else_changes(tmp_path, capsys):
    """`--resume DIR --total-steps N` runs on to N env steps with the checkpoint's config otherwise;
    other options may be given again with the checkpoint's values (as `fnrl launch` does), a changed
    one is refused with one line, as is an N the run has already reached."""
    from fnrl.cli import main
    from fnrl.errors import ConfigError

    options = dict(compile=False, quiet=True, tensorboard=False, plot=False, eval_episodes=0)
    run = tmp_path / "run"
    training.train("dqn", DQN, seed=1, log_dir=run, **options)
    extended = training.train("dqn", None, resume=run, changes={"total_steps": 2 * DQN.total_steps,
                                                                "batch_size": DQN.batch_size}, **options)
    assert extended.history[-1]["env_steps"] == 2 * DQN.total_steps
    ckpt = training.load_checkpoint(run)
    saved = type(DQN)(**config_from_json(ckpt["config"]))
    assert saved == dataclasses.replace(DQN, total_steps=2 * DQN.total_steps)
    with pytest.raises(ConfigError, match="must be more than that"):
        training.train("dqn", None, resume=run, changes={"total_steps": DQN.total_steps // 2}, **options)
    assert main(["train", "dqn", "--resume", str(run), "--learning-rate", "0.1", "--batch-size", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "only --total-steps may change" in err and "--batch-size, --learning-rate" in err
    assert len(err.splitlines()) == 1
