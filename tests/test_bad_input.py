"""Bad input through the real `fnrl` command, as a user types it: one line naming the problem and
what to do, exit code 2, before any work, nothing left behind (the table in docs/usage.md)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from fnrl.run.checkpoint import CHECKPOINT, CHECKPOINT_FORMAT

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _fnrl(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnrl", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _grid(tmp_path, text: str, name: str = "grid.py") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD_GRID = ("GRID = dict(algo='ppo', env_id='CartPole-v1', seed={seed}, overrides={{'total_steps': 256}}, "
             "args=['--no-compile'], root={root!r})\n")


def _cases(tmp_path):
    """(argv, the message's words, what must not exist afterwards) of every bad input."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a folder")
    no_state = tmp_path / "no-state"
    no_state.mkdir()
    torch.save({"format": CHECKPOINT_FORMAT, "algo": "ppo", "seed": 0, "config": {}, "counters": {}},
               no_state / CHECKPOINT)
    corrupt_root = tmp_path / "corrupt"
    corrupt = _grid(tmp_path, GOOD_GRID.format(seed=0, root=str(corrupt_root)), "corrupt.py")
    (corrupt_root / "ppo-CartPole-v1-s0").mkdir(parents=True)
    (corrupt_root / "ppo-CartPole-v1-s0" / "launch.json").write_text("{not json")
    older = tmp_path / "older"
    older.mkdir()
    torch.save({"format": "fnrl-checkpoint-v1", "algo": "ppo"}, older / CHECKPOINT)
    return [
        (["train", "nope"], "unknown algorithm 'nope'", []),
        (["train", "ppo", "--env", "CartPol-v1"], "unknown env id", []),
        (["train", "ppo", "--env", "no_such_module:Env-v0"], "cannot import module 'no_such_module'", []),
        (["check-env", "CartPol-v1"], "unknown env id", []),
        (["train", "ppo", "--env-kwargs", "{length: 7}"], "--env-kwargs: '{length: 7}' is not JSON", []),
        (["train", "ppo", "--env-kwargs", '{"no_such_kwarg": 1}'], "CartPole-v1 refused its env kwargs", []),
        (["train", "ppo", "--sampler", "graph", "--env-kwargs", '{"max_episode_steps": 50}'],
         "--sampler graph steps fnrl's own torch version", []),
        (["train", "ppo", "--num-minibatches", "3"], "does not divide", []),
        (["train", "ppo", "--learning-rat", "1e-3"], "unrecognized arguments", []),
        (["train", "ppo", "--log-dir", "/nonexistent-parent/run"], "log dir parent", []),
        (["train", "dqn", "--env", "Pendulum-v1"], "discrete action space", []),
        (["train", "ppo", "--env-threads", "-1"], "--env-threads must be >= 0", []),
        (["train", "ppo", "--update-threads", "0"], "--update-threads must be at least 1", []),
        (["train", "impala", "--update-threads", "2"], "--update-threads applies to the serial training loop", []),
        (["eval", "/nonexistent/checkpoint.pt"], "no checkpoint", []),
        (["eval", older], "written by another fnrl version", []),
        (["frobnicate"], "unknown command", []),
        (["train", "ppo", "--log-dir", a_file], "is a file, not a folder", []),
        (["train", "ppo", "--threads", "0", "--log-dir", tmp_path / "threads"], "--threads must be at least 1",
         [tmp_path / "threads"]),
        (["launch", _grid(tmp_path, "GRID = dict(algo='ppo'\n", "syntax.py")], "has a syntax error at line", []),
        (["launch", _grid(tmp_path, GOOD_GRID.format(seed="'abc'", root=str(tmp_path / "abc")), "abc.py")],
         "grid seeds are non-negative integers, got 'abc'", [tmp_path / "abc"]),
        (["launch", corrupt], "launch.json is corrupt", [corrupt_root / "ppo-CartPole-v1-s0" / "stdout.log"]),
        (["eval", no_state], "has no 'state' entry", []),
        (["train", "ppo", "--sampler", "parallel", "--sampler-workers", "3", "--num-envs", "4", "--log-dir",
          tmp_path / "parallel"], "--sampler-workers 3 must be at least 1 and divide --num-envs 4",
         [tmp_path / "parallel"]),
    ]


def _fnrl_here(argv, capsys) -> tuple[int, str]:
    """`fnrl ARGV` in this process (the command's own `main`): (exit code, stderr)."""
    from fnrl.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


# the real command for these (the exit code as a shell sees it); the others through `main` in this
# process, as a subprocess's interpreter start would cost each of them seconds
AS_TYPED = ("unknown algorithm", "unrecognized arguments", "launch.json is corrupt", "--sampler-workers 3")


def test_every_bad_input_is_one_line_and_exit_2_leaving_nothing_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv, words, absent in _cases(tmp_path):
        if any(w in words for w in AS_TYPED):
            done = _fnrl(*argv, cwd=tmp_path)
            code, err = done.returncode, done.stderr
        else:
            code, err = _fnrl_here(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2, (argv, err)
        assert len(lines) == 1 and words in lines[0], (argv, err)
        assert not any(p.exists() for p in absent), argv
    assert not (tmp_path / "runs").exists()


def test_a_folder_held_by_a_live_run_is_refused_and_a_dead_runs_lock_taken_over(tmp_path):
    import socket

    from fnrl.run.folder import LOCK, claim_run_dir, release_run_dir

    held = tmp_path / "held"
    held.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (held / LOCK).write_text(f"{socket.gethostname()} {sleeper.pid}\n")
        done = _fnrl("train", "ppo", "--log-dir", held, "--no-compile", cwd=tmp_path)
        assert done.returncode == 2 and "is in use by another run" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and not (held / "progress.csv").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    claim_run_dir(held)   # its process is gone: the lock is stale
    assert (held / LOCK).read_text().split() == [socket.gethostname(), str(os.getpid())]
    claim_run_dir(held)   # this process may claim its own folder again (a resumed run in one process)
    release_run_dir(held)
    assert not (held / LOCK).exists()


def test_a_yaml_grid_with_a_syntax_error_is_one_line(tmp_path):
    pytest.importorskip("yaml")
    grid = _grid(tmp_path, "algo: [ppo\nenv_id: CartPole-v1\n", "grid.yaml")
    done = _fnrl("launch", grid, cwd=tmp_path)
    assert done.returncode == 2 and "is not valid YAML" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_dead_parallel_worker_stops_training_with_one_line(tmp_path, monkeypatch):
    """A worker of `--sampler parallel` that dies mid-run: one TrainingError line naming it and the
    env step, as the async and central loops give (the sampler's own error is tested in
    tests/test_samplers.py)."""
    from fnrl import algos, samplers
    from fnrl.errors import SamplerError
    from fnrl.train import TrainingError, train

    made = samplers.make

    def failing(*args, **kwargs):
        sampler = made(*args, **kwargs)
        collect, calls = sampler.collect, []

        def collect_then_fail(state):
            calls.append(1)
            if len(calls) == 3:
                raise SamplerError("parallel sampler worker 1 (pid 123) died (killed by SIGKILL)")
            return collect(state)

        sampler.collect = collect_then_fail
        return sampler

    monkeypatch.setattr(samplers, "make", failing)
    config = algos.default_config("ppo")
    config = type(config)(**{**config.__dict__, "total_steps": 2048, "num_envs": 4, "num_steps": 32})
    with pytest.raises(TrainingError, match=r"worker 1 \(pid 123\) died .* \(at env step 256\); no checkpoint"):
        train("ppo", config, compile=False, quiet=True, tensorboard=False, plot=False, log_dir=tmp_path / "run",
              checkpoint_every=1024)
