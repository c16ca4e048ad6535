"""Checkpoints are read without running code from them, and written atomically and durably
(`fnrl.run.checkpoint`, `fnrl.run.plain`)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from fnrl.errors import ConfigError
from fnrl.run import checkpoint
from fnrl.run.checkpoint import CHECKPOINT, CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from fnrl.run.plain import TAG, from_plain, to_plain


class _Planted:
    """Unpickling this object creates the file `marker`: what a crafted checkpoint would run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _crafted(folder: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"format": CHECKPOINT_FORMAT, "algo": "ppo", "seed": 0, "config": {}, "state": _Planted(marker),
                "counters": {}, "world_size": 1}, folder / CHECKPOINT)
    return folder


def _fnrl(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnrl", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[1])})


def test_a_crafted_checkpoint_runs_no_code_through_load_eval_or_resume(tmp_path):
    marker = tmp_path / "pwned"
    run = _crafted(tmp_path / "run", marker)
    with pytest.raises(ConfigError, match="was not opened: it holds objects"):
        load_checkpoint(run)
    for argv in (["eval", str(run)], ["train", "ppo", "--resume", str(run), "--no-compile", "--quiet"]):
        done = _fnrl(*argv, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "was not opened" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not marker.exists()


def test_a_launched_grid_refuses_a_crafted_checkpoint_in_a_run_folder(tmp_path):
    """`fnrl launch` resumes any run folder holding a checkpoint: a planted one is refused there too."""
    from fnrl.launch import expand, load_grid

    grid = tmp_path / "grid.py"
    grid.write_text(f"GRID = dict(algo='ppo', env_id='CartPole-v1', seed=0, overrides={{'total_steps': 256, "
                    f"'num_envs': 4, 'num_steps': 32}}, args=['--no-compile'], root={str(tmp_path / 'runs')!r})\n")
    (run,) = expand(load_grid(grid))
    marker = tmp_path / "pwned"
    _crafted(run.folder, marker)
    done = _fnrl("launch", str(grid), "--slots", "1", cwd=tmp_path)
    assert not marker.exists()
    assert "was not opened" in (run.folder / "stdout.log").read_text(), done.stdout + done.stderr


def test_plain_data_round_trips_every_kind_of_value_a_checkpoint_holds():
    from fnrl import replay

    rollout = TensorDict({"obs": torch.randn(4, 2, 3), "action": torch.zeros(4, 2, dtype=torch.int64),
                          "reward": torch.ones(4, 2), "terminated": torch.zeros(4, 2, dtype=torch.bool),
                          "done": torch.zeros(4, 2, dtype=torch.bool), "valid": torch.ones(4, 2, dtype=torch.bool)},
                         batch_size=[4, 2])
    buffer = replay.add(replay.init(rollout, capacity=16), rollout)
    payload = {"state": TensorDict({"params": {"w": torch.arange(3.0)}, "step": torch.tensor(2)}, []),
               "numpy_rng": np.random.get_state(), "arrays": [np.arange(5, dtype=np.uint32), np.float64(0.5)],
               "replay": buffer, "device": torch.device("cpu"), "text": "x", "nothing": None, "raw": (1, 2.5, True)}
    plain = to_plain(payload)
    back = from_plain(plain)
    assert torch.equal(back["state"]["params", "w"], torch.arange(3.0)) and back["state"].batch_size == ()
    assert back["numpy_rng"][0] == "MT19937" and np.array_equal(back["numpy_rng"][1], payload["numpy_rng"][1])
    assert back["arrays"][0].dtype == np.uint32 and back["arrays"][1] == 0.5
    assert type(back["replay"]) is type(buffer) and back["replay"].spec == buffer.spec
    assert torch.equal(back["replay"].storage["obs"], buffer.storage["obs"])
    assert back["raw"] == (1, 2.5, True) and back["device"] == torch.device("cpu")


def test_values_a_checkpoint_cannot_hold_are_refused_before_anything_is_written(tmp_path):
    class Foreign:
        pass

    for value, match in ((Foreign(), "Foreign"), (np.array([object()]), "Python objects"),
                         ({TAG: "x"}, "reserved key"), (lambda: 0, "function")):
        with pytest.raises(TypeError, match=match):
            save_checkpoint(tmp_path / CHECKPOINT, {"format": CHECKPOINT_FORMAT, "value": value})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="does not rebuild"):
        from_plain({TAG: "dataclass", "type": "Popen", "fields": {}})


def _whole(**entries) -> dict:
    return {"format": CHECKPOINT_FORMAT, "algo": "ppo", "seed": 0, "config": {}, "counters": {},
            "state": TensorDict({"w": torch.zeros(2)}, []), **entries}


def test_a_checkpoint_missing_an_entry_is_one_config_error(tmp_path):
    whole = _whole()
    for key in ("state", "algo", "counters"):
        save_checkpoint(tmp_path / CHECKPOINT, {k: v for k, v in whole.items() if k != key})
        with pytest.raises(ConfigError, match=f"has no '{key}' entry"):
            load_checkpoint(tmp_path)
    save_checkpoint(tmp_path / CHECKPOINT, {**whole, "state": [1, 2]})
    with pytest.raises(ConfigError, match="has a malformed 'state' entry"):
        load_checkpoint(tmp_path)


def test_a_failed_write_keeps_the_old_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    save_checkpoint(path, _whole(n=1))
    synced = []
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: synced.append(fd))
    save_checkpoint(path, _whole(n=2))
    assert len(synced) == 2   # the file, then the folder
    assert load_checkpoint(path)["n"] == 2

    def broken(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, _whole(n=3))
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]
    assert load_checkpoint(path)["n"] == 2


def test_an_exported_policy_holds_what_acting_reads_and_evaluates_as_its_checkpoint(tmp_path, capsys):
    from fnrl import algos
    from fnrl.cli import main
    from fnrl.evaluate import evaluate_checkpoint
    from fnrl.export import export_policy
    from fnrl.train import train

    config = {"total_steps": 2048, "num_envs": 4, "num_steps": 32}
    for algo, act_keys in (("ppo", {"params", "obs_rms"}), ("dqn", {"params", "env_steps"})):
        run = tmp_path / algo
        cfg = type(algos.default_config(algo))(**{**algos.default_config(algo).__dict__, **config})
        train(algo, cfg, seed=0, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False,
              eval_episodes=0)
        assert main(["export", str(run)]) == 0
        assert "policy written to" in capsys.readouterr().out
        policy = load_checkpoint(run / "policy.pt", policy=True)
        assert policy["algo"] == algo and policy["config"]["total_steps"] == 2048
        assert set(policy["state"].keys()) <= act_keys and "opt_state" not in policy["state"].keys()
        assert (run / "policy.pt").stat().st_size < (run / CHECKPOINT).stat().st_size
        assert evaluate_checkpoint(run / "policy.pt", episodes=3) == evaluate_checkpoint(run, episodes=3)
    with pytest.raises(ConfigError, match="would overwrite the run's checkpoint"):
        export_policy(tmp_path / "ppo", tmp_path / "ppo" / CHECKPOINT)
    with pytest.raises(ConfigError, match="is a policy file"):
        load_checkpoint(tmp_path / "ppo" / "policy.pt")   # a policy file is no checkpoint to resume
