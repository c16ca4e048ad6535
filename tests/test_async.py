"""The async sampler: shared replay under concurrent writes, throttle, shutdown, learning.

Every test that starts a process bounds every wait with a timeout and kills what is
left in its teardown, so none can hang or leave a child behind.
"""
import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from fnrl import replay
from fnrl.algos import default_config
from fnrl.errors import ConfigError
from fnrl.presets import configure
from fnrl.replay.shared import SharedReplay
from fnrl.replay.sum_tree import sum_tree_levels
from fnrl.samplers.async_ import (PROCESS_NAME, AsyncSampler, SamplerError, SharedParams, Throttle,
                                  start_method)
from fnrl.train import load_checkpoint, train
from tests.learning import final_evaluations
from tests.processes import alive as _alive, children as _children, comm as _comm

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 300.0   # a loaded machine can take minutes to import torch in a fresh interpreter


# ---------------------------------------------------------------- process hygiene helpers
def _wait_until(predicate, timeout: float, what: str, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def processes():
    """multiprocessing children started by a test: stopped in teardown whatever happened."""
    started = []
    yield started
    for p in started:
        if p.is_alive():
            p.kill()
        p.join(10)
    assert not any(p.is_alive() for p in started)


# ---------------------------------------------------------------- throttle and params (no processes)
def test_throttle_due_matches_the_serial_loop():
    # serial: after each collect of S=16 steps at E >= learning_starts, credit += S r; updates = floor(credit)
    for learning_starts, r in [(1_000, 0.25), (0, 0.1), (100, 1.5), (16, 0.25)]:
        t = Throttle(steps_per_collect=16, learning_starts=learning_starts, replay_ratio=r, max_lead=64)
        credit, updates = 0.0, 0
        for E in range(16, 3_000, 16):
            if E >= learning_starts:
                credit += 16 * r
                while credit >= 1.0:
                    credit, updates = credit - 1.0, updates + 1
            assert t.due(E) == updates, (learning_starts, r, E)
    t = Throttle(steps_per_collect=16, learning_starts=1_000, replay_ratio=0.25, max_lead=64)
    assert t.first_update_step == 1_008 and t.due(1_007) == 0 and t.due(1_008) == 4
    # owes 17 updates > 0.25 * 64 = 16: wait, but never while the optimizer cannot sample
    assert t.sampler_must_wait(1_072, updates=3, can_sample=True)
    assert not t.sampler_must_wait(1_072, updates=4, can_sample=True)
    assert not t.sampler_must_wait(1_072, updates=3, can_sample=False)
    assert not Throttle(16, 0, 0.25, None).sampler_must_wait(10_000, 0, True)


def test_shared_params_version():
    import multiprocessing

    lock = multiprocessing.get_context("fork").Lock()
    params = TensorDict({"params": {"w": torch.zeros(3)}}, batch_size=[])
    shared = SharedParams(params, lock)
    assert shared.params["params", "w"].is_shared()
    dest = params.clone()
    assert shared.pull(dest, have=0) == 0                 # same version: nothing copied
    shared.publish(TensorDict({"params": {"w": torch.ones(3)}}, batch_size=[]), version=5)
    assert dest["params", "w"].sum() == 0
    assert shared.pull(dest, have=0) == 5 and torch.equal(dest["params", "w"], torch.ones(3))


# ---------------------------------------------------------------- stress: no torn batch
B, T, C, N_STEP = 4, 8, 64, 3


def _rows(start: int) -> TensorDict:
    """Rows start .. start + T - 1 of every env, each field = the row's global write index g = a B + b."""
    g = (torch.arange(start, start + T).unsqueeze(1)) * B + torch.arange(B)
    return TensorDict({
        "obs": g.double().unsqueeze(-1).expand(T, B, 2).clone(), "action": g, "payload": g, "reward": g.double(),
        "terminated": torch.zeros(T, B, dtype=torch.bool), "done": torch.zeros(T, B, dtype=torch.bool),
        "valid": torch.ones(T, B, dtype=torch.bool)}, batch_size=[T, B])


def _writer(shared: SharedReplay, seconds: float) -> None:
    start, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        shared.add(_rows(start))
        start += T


def _check_batch(batch: TensorDict, steps_written: int) -> None:
    g = batch["payload"]
    a, env = g // B, g % B
    assert torch.equal(batch["action"], g) and torch.equal(batch["obs"], g.double().unsqueeze(-1).expand(-1, 2))
    assert torch.equal(batch["index"] // B, a % C) and torch.equal(batch["index"] % B, env), "index names another row"
    assert bool((a <= steps_written - 1 - N_STEP).all()), "a row whose n-step window was not yet written"
    assert bool((a >= steps_written - C).all()), "a row already overwritten"
    # gamma = 1, no episode end: reward = sum_k (g + k B), bootstrap = obs of row a + n
    assert torch.equal(batch["reward"], N_STEP * g.double() + B * N_STEP * (N_STEP - 1) / 2)
    assert torch.equal(batch["next_obs"], (g + N_STEP * B).double().unsqueeze(-1).expand(-1, 2))
    assert torch.equal(batch["discount"], torch.ones_like(batch["discount"]))


def _check_tree(buffer) -> None:
    levels = sum_tree_levels(buffer.tree)
    for parent, children in zip(levels[:-1], levels[1:]):
        torch.testing.assert_close(parent, children.view(-1, 32).sum(-1))
    leaves = levels[-1][:C * B].view(C, B)
    expected = buffer.rows["priority"].double() * buffer.rows["sampleable"]
    torch.testing.assert_close(leaves, expected)


@pytest.mark.parametrize("prioritized", [False, True])
def test_stress_writer_and_reader_never_tear(prioritized, processes):
    ctx = torch.multiprocessing.get_context(start_method("cpu"))
    buffer = replay.init(_rows(0), C * B, n_step=N_STEP, gamma=1.0, prioritized=prioritized)
    shared = SharedReplay(buffer, ctx.RLock())
    writer = ctx.Process(target=_writer, args=(shared, 4.0), daemon=True)
    processes.append(writer)
    writer.start()
    generator = torch.Generator().manual_seed(0)
    batches, deadline = 0, time.monotonic() + 120
    while writer.is_alive() and time.monotonic() < deadline:
        with shared.lock:      # RLock: hold it around sample and W to know what was written
            batch = shared.sample(32, beta=0.5, generator=generator)
            steps_written = shared.steps_written
        if batch is None:
            continue
        _check_batch(batch, steps_written)
        if prioritized:
            shared.update_priorities(batch["index"], torch.rand(32, generator=generator) * 10)
        batches += 1
    writer.join(30)
    assert writer.exitcode == 0
    assert shared.steps_written > 4 * C, "the writer wrapped the ring too few times to stress it"
    assert batches > 20
    _check_tree(shared.snapshot())
    _check_batch(shared.sample(128, generator=generator), shared.steps_written)


# ---------------------------------------------------------------- a failing sampler is reported
def _failing_build():
    raise RuntimeError("env factory broke\nsecond line")


def test_sampler_exception_is_one_line_error(processes):
    ctx = torch.multiprocessing.get_context(start_method("cpu"))
    params = SharedParams(TensorDict({"params": {"w": torch.zeros(1)}}, batch_size=[]), ctx.Lock())
    sampler = AsyncSampler(_failing_build, (), replay=None, params=params,
                           throttle=Throttle(4, 0, 1.0, None), horizon=1, total_steps=10)
    sampler.start()
    processes.append(sampler.process)
    sampler.process.join(60)

    with pytest.raises(SamplerError, match=r"failed: RuntimeError: env factory broke$"):
        sampler.check()
    sampler.stop(timeout=5)
    assert not sampler.process.is_alive()


# ---------------------------------------------------------------- config errors, before any work
def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="on-policy"):
        train("ppo", sampler="async", log_dir=tmp_path / "a", quiet=True)
    with pytest.raises(ConfigError, match="sequence replay"):
        train("r2d1", sampler="async", log_dir=tmp_path / "b", quiet=True)
    with pytest.raises(ConfigError, match="unknown sampler"):
        train("dqn", sampler="threads", log_dir=tmp_path / "c", quiet=True)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---------------------------------------------------------------- a short run: counts, lag column, resume
SHORT = dict(total_steps=2_000, learning_starts=400, replay_ratio=0.05, batch_size=32)


def test_short_run_logs_policy_lag_and_resumes(tmp_path):
    config = dataclasses.replace(default_config("dqn"), **SHORT)
    run = tmp_path / "run"
    first = train("dqn", config, seed=0, log_dir=run, compile=False, quiet=True, log_interval=800,
                  tensorboard=False, plot=False, sampler="async", stop_return=-1.0)   # stops at the first row
    assert first.history[0]["env_steps"] < config.total_steps
    ckpt = load_checkpoint(run)
    assert ckpt["counters"]["env_steps"] == first.history[-1]["env_steps"]
    assert ckpt["replay"].steps_written * config.num_envs >= ckpt["counters"]["env_steps"]   # the replay is kept

    result = train("dqn", seed=0, resume=run, compile=False, quiet=True, log_interval=800, tensorboard=False,
                   plot=False, sampler="async")
    rows = result.history
    assert rows[-1]["env_steps"] == config.total_steps
    throttle = Throttle(config.num_steps * config.num_envs, config.learning_starts, config.replay_ratio, None)
    assert rows[-1]["updates"] == throttle.due(config.total_steps) == int(result.state["updates"])   # as serial
    assert all("policy_lag" in row and row["policy_lag"] >= 0 for row in rows)
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    assert {"policy_lag", "opt_wait", "sampler_wait", "loss/q"} <= set(header)
    assert [r["env_steps"] for r in rows] == sorted(r["env_steps"] for r in rows)
    last = load_checkpoint(run)
    assert last["counters"]["env_steps"] == config.total_steps
    assert last["replay"].steps_written * config.num_envs >= config.total_steps   # resumed with the first part's rows


def test_sac_runs_async(tmp_path):
    """Continuous control (qpg family) through the same path: the update count is the serial loop's."""
    config = dataclasses.replace(default_config("sac"), total_steps=480, learning_starts=160, batch_size=32)
    result = train("sac", config, seed=0, log_dir=tmp_path / "sac", compile=False, quiet=True, log_interval=160,
                   tensorboard=False, plot=False, sampler="async")
    throttle = Throttle(config.num_steps * config.num_envs, config.learning_starts, config.replay_ratio, None)
    assert result.history[-1]["updates"] == throttle.due(480) == int(result.state["updates"])
    assert all(math.isfinite(result.history[-1][k]) for k in ("loss/critic", "loss/actor"))


# ---------------------------------------------------------------- shutdown of a real CLI run
def _start_cli(tmp_path):
    """`fnrl train dqn --sampler async` in a subprocess: logs every 4,000 env steps, checkpoints every
    40,000; a run far longer than the tests wait (each ends it with a signal or a kill)."""
    log = open(tmp_path / "stderr.txt", "w")
    cmd = [sys.executable, "-m", "fnrl.cli", "train", "dqn", "--sampler", "async", "--no-compile", "--quiet",
           "--log-dir", str(tmp_path / "run"), "--total-steps", "400000", "--learning-starts", "1000",
           "--replay-ratio", "0.02", "--batch-size", "32"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # SIGINT's default action in the child: a test run started in the background (`pytest &` from a
    # non-interactive shell) ignores SIGINT, and an ignored SIGINT is inherited across exec
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp_path,
                            start_new_session=True, preexec_fn=_default_sigint)
    return proc, log


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sampler_of(proc) -> int:
    def find():
        found = [c for c in _children(proc.pid) if _comm(c) == PROCESS_NAME.decode()]
        assert proc.poll() is None, (proc.returncode, "the run ended early")
        return found[0] if found else None
    return _wait_until(find, STARTUP_S, "the sampler process")


@pytest.fixture
def cli_run(tmp_path):
    started = []

    def start():
        proc, log = _start_cli(tmp_path)
        started.append((proc, log))
        return proc
    yield start
    for proc, log in started:
        pids = [proc.pid] + _children(proc.pid)
        for pid in pids:
            _kill(pid)
        proc.wait(30)
        log.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_signal_checkpoints_the_run_and_stops_both_processes(tmp_path, cli_run, signum):
    from fnrl.train import load_checkpoint

    proc = cli_run()
    sampler = _sampler_of(proc)
    _wait_until(lambda: (tmp_path / "run" / "progress.csv").exists(), STARTUP_S, "the first log row")
    os.kill(proc.pid, signum)
    code = proc.wait(120)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 128 + signum, stderr
    ckpt = load_checkpoint(tmp_path / "run")
    assert f"stopped by {signal.Signals(signum).name} at env step {ckpt['counters']['env_steps']}" in stderr
    _wait_until(lambda: not _alive(sampler), 30, "the sampler to exit")


def test_sampler_exits_when_the_main_process_is_killed(tmp_path, cli_run):
    proc = cli_run()
    sampler = _sampler_of(proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(60)
    _wait_until(lambda: not _alive(sampler), 60, "the orphaned sampler to exit")


# ---------------------------------------------------------------- learning
@pytest.mark.slow
@pytest.mark.matrix   # two processes on a core for 2-4 minutes: CI's time goes to the tests above
def test_dqn_async_learns_cartpole(tmp_path):
    """`fnrl train dqn --sampler async` with DQN's CartPole preset (50k env steps): the final
    evaluation without exploration (10 episodes on separate envs) is 400 or more on seed 0, or on
    seed 1 where seed 0 misses, and the policy lag is logged.

    Async runs are not reproducible (what the learner sees depends on the two processes' timing);
    seed 0 ended at 195 once in a full suite run, with the other tests sharing the cores, and above
    400 in its runs alone. A second seed makes a working async DQN fail far less often; a broken
    one fails always."""
    config, preset = configure("dqn", "CartPole-v1")
    assert preset == "dqn/CartPole-v1"
    for seed in (0, 1):
        t0 = time.perf_counter()
        result = train("dqn", config, seed=seed, log_dir=tmp_path / f"run{seed}", compile=True, quiet=True,
                       log_interval=2_000, tensorboard=False, plot=False, sampler="async")
        curve = [(row["env_steps"], round(row["return_mean"]), row["policy_lag"]) for row in result.history
                 if math.isfinite(row["return_mean"])]
        final = final_evaluations(result)[0]
        print(f"async dqn seed {seed}: {time.perf_counter() - t0:.0f} s, final evaluation {final:.1f}, "
              f"(env steps, return, lag) {curve}")
        assert result.history[-1]["env_steps"] <= config.total_steps + config.num_envs * config.num_steps
        assert curve and all(lag >= 0 for _, _, lag in curve)
        if final >= 400:
            break
    assert final >= 400, curve


def test_priorities_skip_rows_written_over_since_the_sample():
    """A row drawn before the writer wrapped around to it keeps the new row's priority: only rows
    still holding what was sampled take the learner's TD errors."""
    import threading

    buffer = replay.init(_rows(0), C * B, n_step=N_STEP, gamma=1.0, prioritized=True)
    shared = SharedReplay(buffer, threading.RLock())
    shared.add(_rows(0))
    sampled_at = shared.steps_written                        # T rows per env: positions 0 .. T - 1
    index = torch.arange(C * B)                              # every position of every env
    shared.add(_rows(T))                                     # positions T .. 2T - 1 (mod C) written over
    before = shared.snapshot().rows["priority"].clone()
    shared.update_priorities(index, torch.full((C * B,), 7.0), sampled_at)
    after = shared.snapshot().rows["priority"]
    position = torch.arange(C).unsqueeze(1).expand(C, B)
    overwritten = (position - sampled_at) % C < T
    assert torch.equal(after[overwritten], before[overwritten])
    expected = (7.0 + buffer.spec.priority_eps) ** buffer.spec.alpha
    assert torch.allclose(after[~overwritten], torch.full_like(after[~overwritten], expected))
