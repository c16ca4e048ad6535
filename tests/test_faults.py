"""Faults injected into real runs of the `fnrl` command, at a random moment after the first
checkpoint: a SIGKILL'd worker (a `--sampler parallel` worker, the `--sampler async` sampler, an
IMPALA actor) ends the run in bounded time with one line, no process and no shared memory
(/dev/shm) left behind, and a last checkpoint that loads and resumes; a SIGKILL'd learner leaves
no worker behind. (A SIGTERM to the whole run: tests/test_stop_signals.py.)"""
from __future__ import annotations

import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.processes import children, cmdline, comm, descendants, leaked_shared_memory, shared_memory, wait_gone

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = {
    "parallel": ["ppo", "--sampler", "parallel", "--sampler-workers", "2", "--num-envs", "4", "--num-steps", "32"],
    "async": ["dqn", "--sampler", "async", "--learning-starts", "1000", "--replay-ratio", "0.02", "--batch-size", "32"],
    "impala": ["impala"],
}
EXTEND = 5_000
"""env steps a resumed run adds to the killed run's checkpoint"""
LINUX = pytest.mark.skipif(not pathlib.Path("/proc/self/task").exists(), reason="reads processes from Linux's /proc")


def _workers(kind: str, pid: int) -> list[int]:
    """The run's worker processes: the parallel sampler's (forked by the forkserver), the async
    sampler, IMPALA's actors (forked by the learner)."""
    if kind == "parallel":
        return [w for s in children(pid) if "forkserver" in cmdline(s) for w in children(s)]
    kids = [k for k in children(pid) if not any(h in cmdline(k) for h in ("resource_tracker", "forkserver"))]
    if kind == "async":
        return [k for k in kids if comm(k) == "fnrl-sampler"]
    return kids


def _start(tmp_path, kind: str) -> tuple[subprocess.Popen, list[int], list[int]]:
    """The run, at a random moment up to 2 s after it has logged a row and written a checkpoint:
    (process, its workers, every process under it)."""
    cmd = [sys.executable, "-m", "fnrl", "train", *RUNS[kind], "--total-steps", "60000", "--no-compile", "--quiet",
           "--log-dir", "run"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    run, deadline = tmp_path / "run", time.monotonic() + 300
    while not ((run / "progress.csv").exists() and (run / "checkpoint.pt").exists()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.3)
    delay = random.uniform(0.0, 2.0)
    print(f"killing {delay:.2f} s after the first checkpoint")   # shown if the test fails
    time.sleep(delay)
    return proc, _workers(kind, proc.pid), descendants(proc.pid)


@LINUX
@pytest.mark.parametrize("kind", list(RUNS))
def test_a_killed_worker_stops_the_run_with_one_line_and_a_resumable_checkpoint(tmp_path, kind):
    from fnrl.train import load_checkpoint, train

    before = shared_memory()
    proc, workers, everyone = _start(tmp_path, kind)
    assert len(workers) == {"async": 1}.get(kind, 2), [cmdline(p) for p in everyone]
    os.kill(random.choice(workers), signal.SIGKILL)
    err = proc.communicate(timeout=120)[1]
    lines = [line for line in err.strip().splitlines() if line.startswith("fnrl:")]
    assert proc.returncode == 1, err[-2000:]
    assert len(lines) == 1 and "training stopped" in lines[0] and "died" in lines[0], err[-2000:]
    assert lines[0].endswith("the last checkpoint is run/checkpoint.pt"), err[-2000:]
    assert wait_gone(everyone) == []
    assert leaked_shared_memory(before) == []
    ckpt = load_checkpoint(tmp_path / "run")
    done = ckpt["counters"]["env_steps"]
    assert done > 0
    resumed = train(RUNS[kind][0], None, resume=tmp_path / "run", changes={"total_steps": done + EXTEND},
                    compile=False, quiet=True, tensorboard=False, plot=False, eval_episodes=0)
    assert resumed.history[-1]["env_steps"] >= done + EXTEND


@LINUX
@pytest.mark.parametrize("kind", ["parallel", "impala"])   # the async sampler's: tests/test_async.py
def test_a_killed_learner_leaves_no_worker_behind(tmp_path, kind):
    before = shared_memory()
    proc, workers, everyone = _start(tmp_path, kind)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert wait_gone(everyone) == [], "processes left behind"
    assert leaked_shared_memory(before) == []
