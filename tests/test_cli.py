import csv
import json
import os

import pytest
import torch

from fnrl import train as train_module
from fnrl.accel import compiled
from fnrl.cli import main
from fnrl.train import TrainingError, load_checkpoint, train

TINY = ["--total-steps", "512", "--num-envs", "4", "--num-steps", "32", "--update-epochs", "1", "--no-compile", "--quiet"]


@pytest.mark.parametrize("argv, message", [
    (["train", "nope"], "unknown algorithm 'nope'"),
    (["train", "ppo", "--env", "CartPol-v1"], "unknown env id"),
    (["train", "ppo", "--num-minibatches", "3"], "does not divide"),
    (["train", "ppo", "--learning-rat", "1e-3"], "unrecognized arguments"),
    (["train", "ppo", "--log-dir", "/nonexistent-parent/run"], "log dir parent"),
    (["train", "dqn", "--env", "Pendulum-v1"], "discrete action space"),
    (["train", "ppo", "--env-threads", "-1"], "--env-threads must be >= 0"),
    (["train", "ppo", "--update-threads", "0"], "--update-threads must be at least 1"),
    (["train", "impala", "--update-threads", "2"], "--update-threads applies to the serial training loop"),
    (["eval", "/nonexistent/checkpoint.pt"], "no checkpoint"),
    (["frobnicate"], "unknown command"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_the_command_freezes_what_is_left_after_main_and_main_alone_does_not(monkeypatch):
    import gc

    from fnrl import cli

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(cli, "main", lambda argv=None: calls.append("main") or 7)
    assert cli.command_line() == 7 and calls == ["main", "freeze"]
    monkeypatch.undo()
    before = gc.get_freeze_count()
    assert main(["frobnicate"]) == 2 and gc.get_freeze_count() == before


def test_train_writes_outputs_eval_and_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "ppo", "--log-dir", str(run), "--seed", "3", *TINY]) == 0
    for name in ("progress.csv", "config.json", "checkpoint.pt", "curve.png"):
        assert (run / name).exists(), name
    assert list(run.glob("events.out.tfevents.*"))
    rows = list(csv.DictReader(open(run / "progress.csv")))
    for column in ("env_steps", "updates", "wall_s", "sps", "return_mean", "episodes", "loss/policy"):
        assert column in rows[0]
    assert json.loads((run / "config.json").read_text())["config"]["num_envs"] == 4
    assert main(["eval", str(run), "--episodes", "3"]) == 0
    assert "3 episodes" in capsys.readouterr().out

    # a second run into the same folder must not clobber it; --resume continues it
    assert main(["train", "ppo", "--log-dir", str(run), *TINY]) == 2
    before = load_checkpoint(run)
    assert before["counters"]["env_steps"] == 512
    result = train("ppo", None, resume=run, quiet=True, compile=False, plot=False, tensorboard=False,
                   log_interval=128)
    assert result.history[-1]["env_steps"] == 512  # already complete: nothing more to do
    # a checkpoint of another algorithm is refused
    assert main(["train", "a2c", "--resume", str(run)]) == 2


def test_nan_stops_training_and_keeps_last_checkpoint(tmp_path, monkeypatch):
    real = compiled.make_agent
    calls = {"n": 0}

    def poisoned(module, config, spec, compile, **kwargs):
        agent = real(module, config, spec, compile, **kwargs)

        def update(state, batch):
            state, metrics = agent.update(state, batch)
            calls["n"] += 1
            if calls["n"] >= 3:
                metrics["loss"] = torch.tensor(float("nan"))
            return state, metrics

        return agent._replace(update=update)

    monkeypatch.setattr(compiled, "make_agent", poisoned)
    from fnrl.algos import ppo

    config = ppo.Config(total_steps=2048, num_envs=4, num_steps=32, update_epochs=1)
    with pytest.raises(TrainingError, match="loss became nan by env step 384"):
        train("ppo", config, log_dir=tmp_path / "run", quiet=True, compile=False, log_interval=128,
              checkpoint_every=128, tensorboard=False)
    ckpt = load_checkpoint(tmp_path / "run")
    assert ckpt["counters"]["env_steps"] == 256
    assert all(torch.isfinite(x).all() for x in ckpt["state"]["params"].values(True, True))


def test_corrupt_checkpoint_is_refused(tmp_path, capsys):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["eval", str(tmp_path)]) == 2
    torch.save({"weights": 1}, tmp_path / "checkpoint.pt")
    assert main(["eval", str(tmp_path)]) == 2
    assert "not an fnrl checkpoint" in capsys.readouterr().err
    torch.save({"format": "fnrl-checkpoint-v1", "algo": "ppo"}, tmp_path / "checkpoint.pt")
    assert main(["eval", str(tmp_path)]) == 2
    assert "written by another fnrl version" in capsys.readouterr().err


def test_stop_return_ends_the_run_once_the_last_episodes_reach_it(tmp_path):
    """CountTerm episodes last 3 steps (return 1.0 + 1.1 + 1.2 = 3.3): a --stop-return 1 run stops, checkpointed,
    at the first log row after which 20 episodes have finished, long before its budget."""
    run = tmp_path / "run"
    assert main(["train", "ppo", "--env", "fnrltest/CountTerm-v0", "--log-dir", str(run), "--stop-return", "1",
                 "--num-envs", "2", "--num-steps", "8", "--total-steps", "1024", "--no-compile", "--quiet"]) == 0
    rows = list(csv.DictReader(open(run / "progress.csv")))
    finished = [int(r["episodes"]) for r in rows]
    assert sum(finished[:-1]) < 20 <= sum(finished)
    assert all(float(r["return_mean"]) == pytest.approx(3.3) for r in rows)
    assert load_checkpoint(run)["counters"]["env_steps"] == int(rows[-1]["env_steps"]) < 1024


def test_update_threads_default_rule_and_the_loop_switching_to_them(tmp_path, monkeypatch):
    from fnrl.algos import dqn, ppo, qpg

    cores = len(os.sched_getaffinity(0))
    wide = ppo.Config(num_envs=64, num_steps=128, num_minibatches=4)   # 2048-row minibatches
    assert train_module.update_threads_for(wide, False, 1, 1) == cores
    assert train_module.update_threads_for(ppo.Config(), False, 1, 1) == 1   # 256 rows
    assert train_module.update_threads_for(ppo.Config(), False, 1, 1, images=True) == cores   # conv torso
    assert train_module.update_threads_for(ppo.Config(), False, 8, 1) == cores   # 8 vmapped seeds: 2048 rows
    assert train_module.update_threads_for(dqn.Config(), True, 1, 1) == cores   # batch 128 x 256 x 256
    assert train_module.update_threads_for(dqn.Config(hidden=(120, 84)), True, 1, 1) == 1   # CleanRL's net
    assert train_module.update_threads_for(qpg.Config(), True, 1, 1) == 1   # batch 256 x 64 x 64
    assert train_module.update_threads_for(qpg.Config(hidden=(256, 256)), True, 1, 1) == cores   # MuJoCo nets
    assert train_module.update_threads_for(dqn.Config(hidden=(120, 84)), True, 1, 1, images=True) == cores
    assert train_module.update_threads_for(wide, False, 1, None) is None   # torch's own default is kept

    calls = []
    set_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), set_threads(n)))
    assert main(["train", "ppo", *TINY, "--update-threads", "2", "--log-dir", str(tmp_path / "run")]) == 0
    assert calls[0] == 1 and calls.count(2) == 512 // (4 * 32)   # --threads 1, then 2 around each update
    assert calls[-1] == 1 and torch.get_num_threads() == 1
