"""SIGTERM / SIGINT stop the serial loop at its next iteration boundary with a checkpoint
(`fnrl.run.stop`), and resuming it ends as a run that never stopped; a resumed run's
progress.csv continues from the checkpoint, with no step logged twice."""
from __future__ import annotations

import csv
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from fnrl import algos
from fnrl.run.checkpoint import config_from_json
from fnrl.run.stop import StopRequest, signals_blocked
from fnrl.train import load_checkpoint, train
from tests.processes import children, descendants, leaked_shared_memory, shared_memory, wait_gone

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = dict(total_steps=24_576, num_envs=4, num_steps=32, update_epochs=1, num_minibatches=1)


def _leaves(state) -> dict:
    return {k: v for k, v in state.items(include_nested=True, leaves_only=True)}


def _csv_steps(folder: pathlib.Path) -> list[float]:
    with open(folder / "progress.csv", newline="") as f:
        return [float(r["env_steps"]) for r in csv.DictReader(f)]


def test_a_sigterm_run_writes_its_checkpoint_and_resumes_as_one_never_stopped(tmp_path):
    run = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    proc = subprocess.Popen([sys.executable, "-m", "fnrl", "train", "ppo", "--seed", "5", "--no-compile", "--quiet",
                             "--log-dir", str(run), *flags], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 240
    while (not (run / "progress.csv").exists() or len(_csv_steps(run)) < 3) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    ckpt = load_checkpoint(run)
    stopped_at = ckpt["counters"]["env_steps"]
    assert 0 < stopped_at < SETTINGS["total_steps"] and f"stopped by SIGTERM at env step {stopped_at}" in err
    assert sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp")) == []

    options = dict(compile=False, quiet=True, tensorboard=False, plot=False)
    resumed = train("ppo", None, resume=run, **options)
    config = type(algos.default_config("ppo"))(**config_from_json(ckpt["config"]))   # the preset's, as run
    whole = train("ppo", config, seed=5, log_dir=tmp_path / "whole", **options)
    a, b = _leaves(resumed.state), _leaves(whole.state)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = _csv_steps(run)
    assert steps == sorted(set(steps)) and steps[-1] == SETTINGS["total_steps"]


def test_the_first_signal_is_deferred_and_the_second_acts_at_once():
    before = signal.getsignal(signal.SIGINT)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signum == signal.SIGINT   # noted, nothing raised
        assert signal.getsignal(signal.SIGINT) is before          # a second one acts as it would have
        message = str(stop.stopped("runs/x", 1024))
        assert "stopped by SIGINT at env step 1024" in message and "--resume runs/x" in message
    assert signal.getsignal(signal.SIGINT) is before
    with StopRequest(enabled=False) as off:
        assert signal.getsignal(signal.SIGINT) is before and not off.requested


def test_a_rank_notes_a_second_signal_instead_of_acting_on_it():
    """A rank of a multi-process run may get one stop twice (from the scheduler and forwarded by
    its launcher); it keeps the first and still reaches its checkpoint."""
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest(escalate=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_while_blocked_is_delivered_when_the_block_ends():
    with StopRequest() as stop:
        with signals_blocked():   # blocked in this thread: send it to this thread, not the process
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            assert not stop.requested
        assert stop.signum == signal.SIGTERM


def test_a_resumed_run_drops_the_rows_logged_after_its_checkpoint(tmp_path):
    from fnrl.logger import Logger

    logger = Logger(tmp_path, tensorboard=False)
    for steps in (100, 200, 300, 400):
        logger.log({"env_steps": steps, "return_mean": steps / 10})
    logger.close()
    resumed = Logger(tmp_path, tensorboard=False, resumed_at=200)
    assert [r["env_steps"] for r in resumed.rows] == [100.0, 200.0]
    resumed.log({"env_steps": 300, "return_mean": 31.0})
    resumed.close()
    assert _csv_steps(tmp_path) == [100.0, 200.0, 300.0]
    assert (tmp_path / "progress.csv").read_text().splitlines()[1] == "100,10.0"


# ------------------------------------------------------- a signal to the whole process group
GROUP_RUNS = {
    "parallel": ["ppo", "--sampler", "parallel", "--sampler-workers", "2", "--num-envs", "4", "--num-steps", "32"],
    "async": ["dqn", "--sampler", "async", "--learning-starts", "1000", "--replay-ratio", "0.02", "--batch-size", "32"],
    "impala": ["impala"],
    "nproc": ["ppo", "--nproc", "2", "--num-envs", "4", "--num-steps", "32"],
}


def _start_logging_run(tmp_path, run_kind: str) -> subprocess.Popen:
    """`fnrl train` of GROUP_RUNS[run_kind] into tmp_path/run, in a process group of its own, once
    it has logged its first row."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "fnrl", "train", *GROUP_RUNS[run_kind], "--total-steps", "500000", "--no-compile",
           "--quiet", "--log-dir", str(run)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 300
    while not ((run / "progress.csv").exists() and len(_csv_steps(run)) >= 1):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.3)
    return proc


def _stop(proc: subprocess.Popen, stop) -> str:
    """Call `stop()`, which signals the run, and wait for the run to end: its stderr. The run's
    process group is killed if it is still there (a failed assertion)."""
    try:
        stop()
        return proc.communicate(timeout=180)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _assert_stopped_by_sigterm(proc: subprocess.Popen, err: str, run: pathlib.Path) -> None:
    """Exit 143 and one line naming the env step of the checkpoint written (all ranks' steps), at
    or past the first logged row."""
    lines = [line for line in err.splitlines() if line.startswith("fnrl:")]
    assert proc.returncode == 128 + signal.SIGTERM and len(lines) == 1, err[-3000:]
    ckpt = load_checkpoint(run)
    stopped_at = ckpt["counters"]["env_steps"] * (ckpt.get("world_size") or 1)
    assert f"stopped by SIGTERM at env step {stopped_at};" in lines[0], err[-3000:]
    assert stopped_at >= _csv_steps(run)[0]


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").exists(), reason="reads processes from Linux's /proc")
@pytest.mark.parametrize("run_kind", list(GROUP_RUNS))
def test_a_sigterm_to_the_process_group_checkpoints_the_run_and_leaves_nothing_behind(tmp_path, run_kind):
    """A scheduler's stop (SIGTERM to every process of the job, e.g. SLURM's scancel) reaches the
    workers too: they leave it to the run, which writes its checkpoint at the step it stopped at,
    exits 143 with one line, and leaves no process and no shared memory behind."""
    run, before = tmp_path / "run", shared_memory()
    proc = _start_logging_run(tmp_path, run_kind)
    everyone = descendants(proc.pid)
    _assert_stopped_by_sigterm(proc, _stop(proc, lambda: os.killpg(proc.pid, signal.SIGTERM)), run)
    assert everyone, "the run has no worker processes"
    assert wait_gone(everyone) == []
    assert leaked_shared_memory(before) == []


@pytest.mark.skipif(not pathlib.Path("/proc/self/task").exists(), reason="reads processes from Linux's /proc")
def test_a_worker_that_dies_while_a_stop_is_pending_does_not_cost_the_checkpoint(tmp_path):
    """The signal may reach a worker's side first (an env's own process, say): a worker that dies
    while the stop is pending ends the run as the stop would, with its checkpoint and exit 143."""
    run = tmp_path / "run"
    proc = _start_logging_run(tmp_path, "parallel")

    def stop_then_kill_a_worker():
        workers = [p for p in descendants(proc.pid) if p not in children(proc.pid)]   # the forkserver's forks
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGSTOP)   # the collect in flight waits for it...
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)      # ...the stop is noted...
        time.sleep(0.5)
        os.kill(workers[0], signal.SIGKILL)   # ...and then the worker dies

    _assert_stopped_by_sigterm(proc, _stop(proc, stop_then_kill_a_worker), run)
