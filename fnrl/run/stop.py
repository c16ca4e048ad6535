"""Stopping a run cleanly: SIGTERM (a scheduler's stop) and SIGINT (Ctrl-C) end a training loop
(serial, `--sampler async`, IMPALA's) at its next iteration boundary with a checkpoint, so a
preempted job resumes from where it stopped.

    with StopRequest() as stop:
        while ...:
            ...one iteration...
            if stop.requested:
                checkpoint()
                raise stop.stopped(run_dir, env_steps)

The first signal is only noted (the iteration in flight finishes: its state stays consistent);
a second one acts at once, as it would without this (Ctrl-C twice: a KeyboardInterrupt now).

A run's worker processes (sampler workers, the async sampler, IMPALA's actors) call
`leave_signals_to_parent()`: Ctrl-C and a scheduler's SIGTERM reach the whole process group,
and a worker killed by them would take the run down before its checkpoint. The parent stops its
workers itself (their stop flag or pipe), and each also exits when its parent is gone. A helper
process that is the workers' parent (the forkserver) starts inside `signals_blocked()`. A
worker that dies anyway while a stop is pending (a process of the user's env, say, that the
signal reached first) does not cost the checkpoint: the loop writes it from the state of the
last finished iteration and stops as the signal asked.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def leave_signals_to_parent() -> None:
    """In a worker process: ignore SIGINT and SIGTERM, which the parent handles (module docstring)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)


@contextmanager
def signals_blocked():
    """Block SIGINT and SIGTERM in this thread for the block: a helper process started inside it
    (a forkserver, whose forks are the workers) inherits the blocked mask and outlives a signal to
    the process group. A signal that arrives meanwhile is delivered here when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class RunStopped(KeyboardInterrupt):
    """A run stopped by a signal after writing its checkpoint; `signum` is the signal, and the
    command exits with 128 + signum."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """Defers SIGINT / SIGTERM to the loop's next iteration boundary while open (module docstring).
    Not enabled (`enabled=False`, or off the main thread, where handlers cannot be set) it does
    nothing and `requested` stays False. With `escalate=False` a second signal is noted too: a
    rank of a multi-process run may get the same stop twice (from the scheduler and from its
    launcher), and it must still reach the checkpoint; its launcher escalates instead."""

    def __init__(self, enabled: bool = True, escalate: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.escalate = escalate
        self.signum: int | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _note(self, signum, frame) -> None:
        self.signum = self.signum or signum
        if self.escalate:
            self._restore()   # a second signal acts at once

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def start(self) -> "StopRequest":
        """Defer the signals from now on (`with StopRequest() as stop:` does this, and `close` on exit)."""
        if self.enabled:
            self._previous = {s: signal.getsignal(s) for s in SIGNALS}
            for s in SIGNALS:
                signal.signal(s, self._note)
        return self

    def close(self) -> None:
        """Put the signal handlers back as they were."""
        self._restore()

    def __enter__(self) -> "StopRequest":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def or_failure(self, failure: Exception, checkpoint, run_dir, env_steps: int, alone: bool = True) -> BaseException:
        """What a loop raises when a worker fails: `failure`, or, with a stop pending (the signal
        reached a worker first), the stop itself once `checkpoint()` has written the state of the
        last finished iteration (module docstring). A rank of several (`alone=False`) gets the
        failure: the other ranks cannot agree on the stop with it any more."""
        if not (self.requested and alone):
            return failure
        checkpoint()
        return self.stopped(run_dir, env_steps)

    def stopped(self, run_dir, env_steps: int, signum: int | None = None) -> RunStopped:
        """The RunStopped to raise once the checkpoint at `env_steps` is written; `signum`: the
        signal the ranks agreed on (default: the one this process received)."""
        signum = signum or self.signum
        name = signal.Signals(signum).name
        return RunStopped(f"stopped by {name} at env step {env_steps}; its checkpoint is written: continue "
                          f"with --resume {run_dir}", signum)
