"""The asynchronous sampler (rlpyt's AsyncRl): sampling and optimization in separate processes.

    main process (optimizer, `device`)          sampler process (`sampler_device`, CPU default)
    ----------------------------------          ------------------------------------------------
    sample replay under its lock  <-------------  SerialSampler.collect [T, B] -> replay.add (lock)
    update(state, batch)                          counters: env steps, episode returns (stats lock)
    params.publish(state, updates) -----------> params.pull between collects when the version moved
    throttle: updates <= due(env steps)           throttle: waits while the optimizer owes > max_lead

The sampler process steps its own EnvPool with a CPU copy of the acting parameters and
writes every rollout into a shared-memory replay (`fnrl.replay.shared.SharedReplay`,
or any object with `add(rollout)`). Parameters flow back through `SharedParams`: a
shared TensorDict plus an int64 version (the optimizer's update count when it
published); the sampler copies them between collects when the version changed and
publishes the version it acts with, so the optimizer logs the policy lag in updates.

Throttling (`Throttle`) keeps the run's replay ratio what the serial loop would do:
the optimizer makes update u + 1 only when u < due(E), E = env steps written so far;
the sampler does not start a collect while the optimizer owes more than `max_lead`
env steps' worth of updates (rlpyt's max-lag idea), so the acting policy stays recent.

Shutdown. Every wait has a timeout: waits poll shared counters (no multiprocessing
Event or Condition, whose internal lock a killed process could leave taken) and every
shared lock is a `TimedLock`, which gives up after a timeout and, while it waits, checks
whether the other process is still alive. The sampler ignores SIGINT and SIGTERM (Ctrl-C
and a scheduler's SIGTERM reach the main process, which checkpoints and stops it) and stops
by itself when the shared stop flag is set or its parent process is gone (checked every
collect and every wait), so no child outlives the run. An exception in the sampler is written,
one line, into a shared buffer and the process exits with code 1; the main process checks
`exitcode` every loop and raises `SamplerError` with that line, the exit code or the signal
that killed it.
`AsyncSampler.stop()` sets the stop flag, joins with a timeout, then kills.

Start method: `start_method` gives "fork" on Linux for a CPU sampler (an instant start: the
child does not import torch again) and "spawn" when the sampler runs on CUDA or CUDA is
initialized in the main process (a forked child cannot use CUDA). The training loop
(`fnrl.train_async`) always spawns: a forked child inherits the locks of the training
process's threads (Inductor's compile workers, earlier runs' thread pools), and one held at
the fork hung the child for good. Spawn needs the usual `if __name__ == "__main__":` guard in
scripts.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from fnrl import rng
from fnrl.errors import SamplerError
from fnrl.run.stop import leave_signals_to_parent
from fnrl.samplers.serial import SerialSampler

__all__ = ["AsyncSampler", "SamplerError", "SharedParams", "Throttle", "TimedLock", "start_method"]

POLL_S = 0.05
"""Longest single wait of either process before it rechecks stop / liveness."""


def start_method(sampler_device: str | torch.device = "cpu") -> str:
    """"fork" for a CPU sampler on Linux while CUDA is not initialized here, else "spawn"."""
    if sys.platform.startswith("linux") and torch.device(sampler_device).type == "cpu" \
            and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


@dataclass(frozen=True)
class Throttle:
    """When the optimizer may update and when the sampler must wait.

    With S = steps_per_collect, E0 = learning_starts rounded up to a multiple of S (the
    first collect boundary at which the serial loop updates) and r = replay_ratio:
        due(E) = floor(r (E - E0 + S))  for E >= E0, else 0,
    exactly the updates the serial loop has made after E env steps. The optimizer makes
    update u + 1 only if u < due(E). The sampler waits before a collect while
        due(E) - u > r * max_lead   and the replay can serve a batch,
    i.e. while the optimizer owes more than `max_lead` env steps of updates (None: never
    waits; the data condition keeps a small-buffer run from deadlocking).
    """
    steps_per_collect: int
    learning_starts: int
    replay_ratio: float
    max_lead: int | None

    @property
    def first_update_step(self) -> int:
        S = self.steps_per_collect
        return max(S, -(-self.learning_starts // S) * S)

    def due(self, env_steps: int) -> int:
        E0 = self.first_update_step
        if env_steps < E0:
            return 0
        return math.floor(self.replay_ratio * (env_steps - E0 + self.steps_per_collect) + 1e-9)

    def sampler_must_wait(self, env_steps: int, updates: int, can_sample: bool) -> bool:
        if self.max_lead is None or not can_sample:
            return False
        return self.due(env_steps) - updates > self.replay_ratio * self.max_lead


class TimedLock:
    """A multiprocessing lock whose `with` never blocks forever.

    It tries in POLL_S slices; between tries it calls `on_wait()` (if set), which may
    raise, e.g. because the process that holds the lock has died (a SIGKILLed holder
    never releases it), and it raises TimeoutError after `timeout` seconds. `on_wait` is
    per process: it is not pickled to a child. `acquire`/`release` are the plain lock's.
    """

    def __init__(self, lock, timeout: float = 120.0):
        self.lock, self.timeout, self.on_wait = lock, timeout, None

    def __enter__(self):
        deadline = time.monotonic() + self.timeout
        while not self.lock.acquire(timeout=POLL_S):
            if self.on_wait is not None:
                self.on_wait()
            if time.monotonic() > deadline:
                raise TimeoutError(f"a shared lock stayed taken for {self.timeout:.0f} s")
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False

    def acquire(self, *args, **kwargs):
        return self.lock.acquire(*args, **kwargs)

    def release(self):
        self.lock.release()

    def __getstate__(self):
        return {"lock": self.lock, "timeout": self.timeout, "on_wait": None}


class SharedParams:
    """Acting parameters in shared memory with a version: one publisher, many readers.

    params: the TensorDict to share (copied to the CPU once); version: int64 [] shared,
    the publisher's update count at its last `publish`. Writes and reads of the values
    hold `lock`, so a reader never copies half-written parameters.
    """

    def __init__(self, params: TensorDict, lock):
        self.params = params.detach().to("cpu").clone().share_memory_()
        self.version = torch.zeros((), dtype=torch.int64).share_memory_()
        self.lock = lock

    def publish(self, params: TensorDict, version: int) -> None:
        """Copy `params` (same keys, any device) in and set the version."""
        with self.lock:
            self.params.update_(params)
            self.version.fill_(version)

    def pull(self, dest: TensorDict, have: int) -> int:
        """Copy the shared values into `dest` (same keys, any device) in place if the version differs
        from `have`; returns the version `dest` now holds."""
        if int(self.version) == have:
            return have
        with self.lock:
            dest.update_(self.params)
            return int(self.version)


# shared int64 counters written by the sampler (S_*) or by the optimizer (O_*)
S_ENV_STEPS, S_EPISODES, S_VERSION, S_HEARTBEAT, S_DONE, O_UPDATES, O_CAN_SAMPLE, O_STOP = range(8)
# shared float64 values written by the sampler: seconds waited, then a ring of the latest episode returns
F_WAIT_S, F_RETURNS = range(2)
RETURN_RING = 4096
"""Episode returns the sampler keeps for the optimizer to read (`AsyncSampler.returns_since`)."""
_ERROR_BYTES = 1024
_SPIN_S = 0.002   # polling step of the waits (no multiprocessing Event: a killed holder would block it)


def _write_error(buffer: torch.Tensor, message: str) -> None:
    data = message.encode("utf-8", "replace")[:_ERROR_BYTES - 1]
    buffer[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffer[len(data):] = 0


def _read_error(buffer: torch.Tensor) -> str:
    return bytes(buffer.tolist()).rstrip(b"\0").decode("utf-8", "replace")


class _Stopped(Exception):
    """Raised inside the sampler process when it must stop (stop flag set or parent gone)."""


class AsyncSampler:
    """Run `SerialSampler` in a child process that writes every rollout into `replay`.

    build: a picklable function, `build(*build_args) -> (env, act, state)` run in the
      child: a BatchedEnv, the policy's `act(state, obs, carry, explore)` and an initial
      state TensorDict holding `env_steps` and the keys of `params.params`.
    replay: an object with `add(rollout)` shared with the child (a SharedReplay); if its
      `lock` is a TimedLock, the child stops waiting on it once told to stop.
    params: `SharedParams` of the acting keys (e.g. state.select("params")).
    throttle: `Throttle`; horizon: T; total_steps: the sampler stops once its env step
      count reaches it; start_env_steps: the count it starts from (resume).
    device: where the child's policy runs ("cpu", or e.g. "cuda:1").
    stall_timeout: seconds without a heartbeat from a live child before `check` fails.
    method: multiprocessing start method (default `start_method(device)`).

    Shared state: int64 counters (env steps written, episodes, the params version the
    child acts with, heartbeat, done; the optimizer's update count and stop flag), float64
    values (seconds the child waited on the throttle, the latest episode returns) and a
    one-line error message. Waits poll these counters; no process ever blocks on an
    object another process could die holding, except the TimedLocks.
    """

    def __init__(self, build: Callable, build_args: tuple, replay, params: SharedParams, throttle: Throttle, *,
                 horizon: int, total_steps: int, start_env_steps: int = 0, device: str | torch.device = "cpu",
                 seed: int = 0, threads: int | None = 1, stall_timeout: float = 300.0, method: str | None = None):
        self.ctx = mp.get_context(method or start_method(device))
        self.replay, self.params, self.throttle = replay, params, throttle
        self.ints = torch.zeros(8, dtype=torch.int64).share_memory_()
        self.floats = torch.zeros(F_RETURNS + RETURN_RING, dtype=torch.float64).share_memory_()
        self.error = torch.zeros(_ERROR_BYTES, dtype=torch.uint8).share_memory_()
        self.ints[S_ENV_STEPS] = start_env_steps
        self.stats_lock = TimedLock(self.ctx.Lock())
        self.stall_timeout = stall_timeout
        self._job = dict(build=build, build_args=build_args, horizon=horizon, total_steps=total_steps,
                         device=str(device), seed=seed, threads=threads)
        self.process = None
        self._heartbeat = (-1, time.monotonic())

    # ---- main-process side -------------------------------------------------------------
    def start(self) -> None:
        """Start the child; from now on the main side's locks fail fast if it dies."""
        self.process = self.ctx.Process(target=_sampler_main, name="fnrl-async-sampler", daemon=True,
                                        args=(self._job, self.replay, self.params, self.throttle, self.ints,
                                              self.floats, self.error, self.stats_lock, os.getpid()))
        self.process.start()
        self._heartbeat = (-1, time.monotonic())
        for lock in (self.stats_lock, self.params.lock, getattr(self.replay, "lock", None)):
            if isinstance(lock, TimedLock):
                lock.on_wait = self.check

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def read(self) -> dict:
        """A consistent snapshot of the sampler's counters."""
        with self.stats_lock:
            ints, wait_s = self.ints.tolist(), float(self.floats[F_WAIT_S])
        return {"env_steps": ints[S_ENV_STEPS], "episodes": ints[S_EPISODES], "version": ints[S_VERSION],
                "done": bool(ints[S_DONE]), "wait_s": wait_s}

    def returns_since(self, episodes: int) -> list[float]:
        """The returns of the episodes finished after the first `episodes` (a count from `read`),
        oldest first; at most the latest `RETURN_RING` of them."""
        with self.stats_lock:
            total = int(self.ints[S_EPISODES])
            ring = self.floats[F_RETURNS:].clone()
        first = max(episodes, total - RETURN_RING)
        return [float(ring[i % RETURN_RING]) for i in range(first, total)]

    def check(self) -> None:
        """Raise SamplerError if the child failed, died, or stopped beating; otherwise return."""
        p = self.process
        code = p.exitcode
        if code is not None and not (code == 0 and bool(self.ints[S_DONE])):
            message = _read_error(self.error)
            if message:
                raise SamplerError(f"sampler process (pid {p.pid}) failed: {message}")
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise SamplerError(f"sampler process (pid {p.pid}) died ({how})")
        beat, now = int(self.ints[S_HEARTBEAT]), time.monotonic()
        if beat != self._heartbeat[0]:
            self._heartbeat = (beat, now)
        elif code is None and now - self._heartbeat[1] > self.stall_timeout:
            raise SamplerError(f"sampler process (pid {p.pid}) made no progress for {self.stall_timeout:.0f} s")

    def notify(self, updates: int, can_sample: bool) -> None:
        """Tell the sampler the optimizer's update count and whether it could sample (for its throttle)."""
        self.ints[O_CAN_SAMPLE] = int(can_sample)
        self.ints[O_UPDATES] = updates

    def wait_for_data(self, timeout: float = POLL_S) -> None:
        """Return once the sampler has written another rollout (or finished), at most after `timeout` s."""
        start, deadline = self.ints[[S_ENV_STEPS, S_DONE]].tolist(), time.monotonic() + timeout
        while self.ints[[S_ENV_STEPS, S_DONE]].tolist() == start and time.monotonic() < deadline:
            time.sleep(_SPIN_S)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the child: stop flag, join(timeout), kill (it ignores SIGTERM). Never raises, never hangs."""
        self.ints[O_STOP] = 1
        p = self.process
        if p is None:
            return
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout)


# ---- child-process side ------------------------------------------------------------------
PROCESS_NAME = b"fnrl-sampler"
"""The sampler's OS-level name (`ps`, /proc/PID/comm) on Linux."""


def set_process_name(name: bytes) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _sampler_main(job, replay, params, throttle, ints, floats, error, stats_lock, parent_pid):
    leave_signals_to_parent()   # Ctrl-C / SIGTERM: the learner stops this process after its checkpoint
    set_process_name(PROCESS_NAME)
    env = None

    def check_stop() -> None:
        if ints[O_STOP] or os.getppid() != parent_pid:
            raise _Stopped

    for lock in (stats_lock, params.lock, getattr(replay, "lock", None)):
        if isinstance(lock, TimedLock):
            lock.on_wait = check_stop
    try:
        if job["threads"] is not None:
            torch.set_num_threads(job["threads"])
        rng.seed_everything(job["seed"], stream=rng.WORKER)
        env, act, state = job["build"](*job["build_args"])
        device = torch.device(job["device"])
        state = state.to(device)
        sampler = SerialSampler(env, act, job["horizon"], device=device)
        acting = state.select(*params.params.keys())
        version = params.pull(acting, -1)
        env_steps = int(ints[S_ENV_STEPS])
        state["env_steps"].fill_(env_steps)
        step = job["horizon"] * env.num_envs
        with torch.no_grad():
            while env_steps < job["total_steps"]:
                waited = time.monotonic()
                while throttle.sampler_must_wait(env_steps, int(ints[O_UPDATES]), bool(ints[O_CAN_SAMPLE])):
                    check_stop()
                    ints[S_HEARTBEAT] += 1
                    time.sleep(_SPIN_S)
                waited = time.monotonic() - waited
                check_stop()
                version = params.pull(acting, version)
                rollout = sampler.collect(state)
                replay.add(rollout)
                env_steps += step
                state["env_steps"].fill_(env_steps)
                returns = rollout["episode_return"][rollout["episode_end"]].tolist()
                with stats_lock:
                    ints[S_ENV_STEPS] = env_steps
                    for g in returns:
                        floats[F_RETURNS + int(ints[S_EPISODES]) % RETURN_RING] = g
                        ints[S_EPISODES] += 1
                    ints[S_VERSION] = version
                    floats[F_WAIT_S] += waited
                ints[S_HEARTBEAT] += 1
        ints[S_DONE] = 1
        ints[S_HEARTBEAT] += 1
    except _Stopped:
        pass
    except BaseException as e:  # noqa: BLE001 - report every failure in one line, then exit non-zero
        _write_error(error, f"{type(e).__name__}: {e}".splitlines()[0])
        os._exit(1)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
