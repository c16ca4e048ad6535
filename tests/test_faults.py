"""Faults injected into real runs of the `fnrl` command: a killed `--sampler parallel` worker or
learner ends in bounded time, with one line where the learner lives, no process left behind, and
a last checkpoint that still loads and resumes. (The async sampler's and IMPALA's actors' kills
are in tests/test_async.py and tests/test_impala.py; SIGTERM in tests/test_stop_signals.py.)"""
from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN = ["train", "ppo", "--env", "CartPole-v1", "--sampler", "parallel", "--sampler-workers", "2", "--num-envs", "4",
       "--num-steps", "32", "--total-steps", "200000", "--no-compile", "--quiet", "--log-dir", "run"]


def _children(pid: int) -> list[int]:
    return [int(k) for task in pathlib.Path(f"/proc/{pid}/task").glob("*/children") for k in task.read_text().split()]


def _alive(pid: int) -> bool:
    status = pathlib.Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except FileNotFoundError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except FileNotFoundError:
        return ""


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _start(tmp_path) -> tuple[subprocess.Popen, list[int], list[int]]:
    """The run, at a random moment up to 2 s after it has logged a row and written a checkpoint:
    (process, its sampler workers (forked by the forkserver), every process under it)."""
    proc = subprocess.Popen([sys.executable, "-m", "fnrl", *RUN], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    run, deadline = tmp_path / "run", time.monotonic() + 300
    while not ((run / "progress.csv").exists() and (run / "checkpoint.pt").exists()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.3)
    delay = random.uniform(0.0, 2.0)
    print(f"killing {delay:.2f} s after the first checkpoint")   # shown if the test fails
    time.sleep(delay)
    servers = [p for p in _children(proc.pid) if "forkserver" in _cmdline(p)]
    workers = [w for s in servers for w in _children(s)]
    return proc, workers, _descendants(proc.pid)


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").exists(), reason="reads processes from Linux's /proc")
def test_a_killed_parallel_worker_stops_the_run_with_one_line_and_a_resumable_checkpoint(tmp_path):
    from fnrl.train import load_checkpoint, train

    proc, workers, everyone = _start(tmp_path)
    assert len(workers) == 2, [_cmdline(p) for p in everyone]
    os.kill(workers[0], signal.SIGKILL)
    err = proc.communicate(timeout=120)[1]
    lines = [line for line in err.strip().splitlines() if line.startswith("fnrl:")]
    assert proc.returncode == 1, err[-2000:]
    assert len(lines) == 1 and "training stopped" in lines[0] and "died" in lines[0], err[-2000:]
    assert "the last checkpoint is" in lines[0]
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in everyone) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [_cmdline(p) for p in everyone if _alive(p)]
    ckpt = load_checkpoint(tmp_path / "run")
    done = ckpt["counters"]["env_steps"]
    assert done > 0 and ckpt["sampler"] == "parallel"
    resumed = train("ppo", None, resume=tmp_path / "run", changes={"total_steps": done + 256}, compile=False,
                    quiet=True, tensorboard=False, plot=False, eval_episodes=0)
    assert resumed.history[-1]["env_steps"] == done + 256


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").exists(), reason="reads processes from Linux's /proc")
def test_a_killed_learner_leaves_no_parallel_worker_behind(tmp_path):
    proc, workers, everyone = _start(tmp_path)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in everyone) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [_cmdline(p) for p in everyone if _alive(p)], "processes left behind"
