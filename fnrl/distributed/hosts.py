"""Hosts that serve one learner over torch.distributed: rendezvous, launch, liveness and stop.

The part that the two multi-host paths share, whatever they send:

- `fnrl.distributed.actors` (Ape-X): actor hosts run the policy and send rollouts into the
  learner's replay;
- `fnrl.distributed.env_hosts` (SEED RL): env hosts only step envs, and the learner acts for them.

    learner (rank 0)                                  host k (rank k = 1..N)
    ----------------                                  ----------------------
    `HostGroup`: TCPStore server, gloo rank 0  <--->  `host_main`: builds, says "ready/k", joins;
      waits for every "ready/k" (or "error/k")          its loop reads the key "learner" through a
      key "learner": a line of ints, stop first         `LearnerLink` (stop, the learner gone) and
      drops a host that died or went silent             adds to "beat/k" every BEAT_S
      stop: sets stop, waits for every "done/k"         says "done/k" when told to stop

Faults. A host that dies (its local process exits or its connection closes), or that is not
heard from (heartbeat or delivery) for `host_timeout` s, is dropped: `HostGroup.drop_gone`
says which, and the path counts its in-flight data as discarded. The store server lives in
the learner's process, so the learner's death makes every host's next store read or send fail,
and the host exits (`LearnerGone`). A dropped host does not rejoin: a rank's place in the process
group is fixed at the rendezvous, so torchrun's elastic restarts do not apply.

Launch: `HostGroup(..., spawn=...)` starts the N hosts as local processes, each in a session of
its own, meeting over loopback: the one-machine stand-in for N hosts that tests use. On real
hosts the same `host_main` runs as ranks 1..N of a torchrun job, rank 0 the learner.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fnrl import rng
from fnrl.errors import ConfigError, SamplerError
from fnrl.run.threads import environ

__all__ = ["HostGroup", "LearnerGone", "LearnerLink", "Rendezvous", "exit_now", "free_port", "host_main",
           "run_host", "torchrun_rendezvous"]

POLL_S = 0.01
"""Longest wait of a host between two looks at the store (stop, the learner alive)."""
BEAT_S = 0.5
"""Seconds between two heartbeats of a host in the store."""
PROCESS_NAME = b"fnrl-actor"
"""A local host's OS-level name (`ps`, /proc/PID/comm) on Linux."""
PORT_VAR = "FNRL_ACTOR_PORT"
"""The learner's store port under torchrun (default: torchrun's MASTER_PORT + 1)."""


def torchrun_rendezvous(hosts: int) -> tuple[Rendezvous, int] | None:
    """Under torchrun (WORLD_SIZE > 1): the rendezvous of a run with `hosts` hosts (the learner,
    rank 0, serves it at MASTER_ADDR, port $FNRL_ACTOR_PORT or MASTER_PORT + 1) and this process's
    rank; None outside torchrun. A ConfigError unless there are hosts + 1 ranks."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    if size != hosts + 1:
        raise ConfigError(f"--actor-hosts {hosts} under torchrun needs {hosts + 1} ranks in all (rank 0 the "
                          f"learner, ranks 1..{hosts} the actor hosts); this launch has {size}")
    port = int(os.environ.get(PORT_VAR) or int(os.environ["MASTER_PORT"]) + 1)
    return Rendezvous(os.environ["MASTER_ADDR"], port, size), int(os.environ["RANK"])


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Rendezvous:
    """Where the learner (rank 0, the store's server) listens, and how many ranks meet there."""

    host: str
    port: int
    world_size: int
    timeout_s: float = 300.0
    """how long joining may take; an established connection never times out (a throttled host
    may send nothing for long, and gloo closes a connection whose receive timed out)"""
    interface: str | None = None
    """gloo's network interface (`GLOO_SOCKET_IFNAME`), e.g. "lo" for local hosts; None: gloo's choice"""

    def store(self, rank: int, serve: bool | None = None) -> dist.Store:
        """A client of the rendezvous store, which rank 0's first client also serves (`serve`:
        whether this one does; default rank == 0). Connecting waits up to `timeout_s`."""
        return dist.TCPStore(self.host, self.port, self.world_size, is_master=rank == 0 if serve is None else serve,
                             timeout=datetime.timedelta(seconds=self.timeout_s), wait_for_workers=False)

    def join(self, rank: int, store: dist.Store) -> None:
        """Join the gloo process group (blocks until every rank has)."""
        with environ("GLOO_SOCKET_IFNAME", self.interface) if self.interface else contextlib.nullcontext():
            dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank,
                                    world_size=self.world_size, timeout=datetime.timedelta(days=365))


# ---- the learner's side --------------------------------------------------------------------------
class HostGroup:
    """The learner's side of N hosts (ranks 1..N): the store it serves, the hosts' liveness, stop.

    rendezvous: where they meet (default: a free loopback port, the N hosts local).
    spawn: (build, build_args, seed, threads) to start the hosts as local processes (`host_main`);
      None: they are started elsewhere (torchrun) and join `rendezvous`.
    host_timeout: seconds without a heartbeat or a delivery (`heard`) before a host is dropped.
    The path using it sets `inboxes[k]` / `outboxes[k]` (`fnrl.distributed.wire`) once joined:
    either one failing marks host k dead, as does adding k to `failed` (a send of its own failed).
    """

    def __init__(self, hosts: int, rendezvous: Rendezvous | None = None, spawn: tuple | None = None,
                 host_timeout: float = 60.0):
        from fnrl.distributed import wire

        self.hosts, self.spawn, self.host_timeout = hosts, spawn, host_timeout
        self.rendezvous = rendezvous or Rendezvous("127.0.0.1", free_port(), hosts + 1, interface=wire.LOOPBACK)
        self.processes: dict[int, mp.Process] = {}
        self.live: set[int] = set()
        self.lost = 0
        self.store = None
        self.inboxes: dict = {}
        self.outboxes: dict = {}
        self.failed: set[int] = set()
        self.beats: dict[int, int] = {}
        self.last_heard: dict[int, float] = {}
        self.lock = threading.Lock()
        self._looked = 0.0

    def open(self) -> None:
        """Start the local hosts (with `spawn`), serve the store, wait until every host is ready and
        join the process group. A SamplerError, with the host's own error where it reported one,
        if a host fails or they do not all arrive within the rendezvous timeout; then call `close`."""
        r = self.rendezvous
        if self.spawn is not None:
            ctx = mp.get_context("spawn")
            for k in range(1, self.hosts + 1):
                self.processes[k] = ctx.Process(target=_local_host, name=f"fnrl-actor-{k}", daemon=True,
                                                args=(r, k, *self.spawn, os.getpid()))
                self.processes[k].start()
        self.store = r.store(0)
        self._wait_until_ready()
        r.join(0, self.store)
        self.live = set(range(1, self.hosts + 1))
        now = time.monotonic()
        for k in self.live:
            self.beats[k], self.last_heard[k] = -1, now

    def _wait_until_ready(self) -> None:
        keys = [f"ready/{k}" for k in range(1, self.hosts + 1)]
        deadline = time.monotonic() + self.rendezvous.timeout_s
        while not self.store.check(keys):
            errors = self.errors()
            exited = [k for k, p in self.processes.items() if p.exitcode is not None]
            if errors or exited:
                raise SamplerError(f"an actor host failed before the run started: "
                                   f"{errors[0] if errors else f'actor {exited[0]} exited'}")
            if time.monotonic() > deadline:
                raise SamplerError(f"the {self.hosts} actor hosts did not all arrive within "
                                   f"{self.rendezvous.timeout_s:.0f} s")
            time.sleep(POLL_S)

    def receive(self, layout, deliver: Callable, what: str) -> None:
        """Agree on `layout` with every live host (each sends its own with `wire.send_layout`; a
        SamplerError if one differs) and receive its messages on a `wire.Inbox`, handed to
        `deliver(k, count, fields)`. `what`: the messages, for the error."""
        from fnrl.distributed import wire

        for k in sorted(self.live):
            try:
                theirs = wire.recv_layout(k)
            except RuntimeError as e:   # it failed after joining: its own error, where it reported one
                errors = self.errors()
                raise SamplerError(f"an actor host failed before the run started: "
                                   f"{errors[0] if errors else f'actor {k}: {e}'.splitlines()[0]}") from None
            if theirs != layout:
                raise SamplerError(f"actor host {k} sends {what} of another layout ({theirs.names}, {theirs.shapes}); "
                                   f"every rank must run the same fnrl version and options")
            self.inboxes[k] = wire.Inbox(layout, k, functools.partial(deliver, k))

    def errors(self) -> list[str]:
        """The one-line errors the hosts have reported in the store, by rank."""
        keys = [f"error/{k}" for k in range(1, self.hosts + 1)]
        return [self.store.get(key).decode() for key in keys if self.store.check([key])]

    def tell(self, *values: int) -> None:
        """Write the line every host's `LearnerLink.look` reads: stop (0 / 1) first, then the path's own."""
        self.store.set("learner", " ".join(str(int(v)) for v in values))

    def heard(self, k: int) -> None:
        """Host k delivered something (a delivery counts as a heartbeat). Call under `lock`."""
        self.last_heard[k] = time.monotonic()

    def dead(self, k: int) -> bool:
        """Whether host k is known to be gone: its local process ended, its connection failed."""
        p, inbox, outbox = self.processes.get(k), self.inboxes.get(k), self.outboxes.get(k)
        return (p is not None and p.exitcode is not None) or k in self.failed or any(
            box is not None and box.error is not None for box in (inbox, outbox))

    def drop_gone(self) -> list[int]:
        """Drop the hosts that died or were not heard from for `host_timeout` s: their ranks."""
        now = time.monotonic()
        look = now - self._looked > BEAT_S
        self._looked = now if look else self._looked
        dropped = []
        for k in sorted(self.live):
            dead = self.dead(k)
            beat = int(self.store.add(f"beat/{k}", 0)) if look else self.beats[k]
            with self.lock:
                if beat != self.beats[k]:
                    self.beats[k], self.last_heard[k] = beat, now
                if dead or now - self.last_heard[k] > self.host_timeout:
                    self.live.discard(k)
                    self.lost += 1
                    dropped.append(k)
        return dropped

    def all_gone(self) -> SamplerError:
        """The error when no host is left."""
        errors = self.errors()
        return SamplerError(f"every actor host is gone ({self.lost} lost; "
                            f"{errors[0] if errors else 'none reported an error'}); the learner gets no more data")

    def wait_done(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` s for every live host that is not known dead to say it has stopped.
        Never raises."""
        deadline = time.monotonic() + timeout
        try:
            while self.store is not None and time.monotonic() < deadline:
                keys = [f"done/{k}" for k in sorted(self.live) if not self.dead(k)]
                if not keys or self.store.check(keys):
                    return
                time.sleep(POLL_S)
        except Exception:  # noqa: BLE001
            pass

    def close(self, timeout: float = 10.0) -> None:
        """Once the hosts are told to stop (`tell`): wait up to `timeout` s for each live one to say
        it has (so none finds the learner gone mid-send), then `leave`. Never raises."""
        deadline = time.monotonic() + timeout
        self.wait_done(timeout)
        self.leave(deadline)

    def leave(self, deadline: float) -> None:
        """Join (or kill) local hosts, wait for the receiving threads to end, close the outboxes and
        leave the process group, waiting until `deadline` (monotonic) at most. Never raises."""
        for p in self.processes.values():
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.is_alive():
                p.kill()
                p.join(5.0)
        # a receiving thread ends once its host has gone; one still blocked in gloo when the
        # interpreter exits would abort the process
        for inbox in self.inboxes.values():
            inbox.thread.join(max(deadline - time.monotonic(), 0.1))
        for outbox in self.outboxes.values():   # no thread left inside the process group it leaves
            outbox.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None


# ---- the host's side ----------------------------------------------------------------------------
class LearnerGone(SamplerError):
    """A host's learner stopped answering (its store or connection is gone)."""


class LearnerLink:
    """A host's view of the learner: the line it tells (`HostGroup.tell`), the heartbeat, and
    `LearnerGone` once the learner's process, store or connection (`inbox`) is gone."""

    def __init__(self, store, rank: int, parent_pid: int | None = None):
        self.store, self.rank, self.parent_pid = store, rank, parent_pid
        self.inbox = None
        self._beat = 0.0
        self._beating: threading.Thread | None = None
        self._quiet = threading.Event()

    def keep_beating(self) -> None:
        """Heartbeat from a thread, every BEAT_S, for a loop that blocks in receives: the store is
        then this thread's alone until `close` (the loop learns of a stop or the learner's end
        from its receives)."""
        def beat():
            while not self._quiet.wait(BEAT_S):
                try:
                    self.look()
                except LearnerGone:
                    return
        self._beating = threading.Thread(target=beat, name="fnrl-heartbeat", daemon=True)
        self._beating.start()

    def close(self) -> None:
        """Stop the heartbeat thread, if any (the store is the caller's again)."""
        self._quiet.set()
        if self._beating is not None:
            self._beating.join(4 * BEAT_S)

    def look(self) -> tuple[bool, list[int]]:
        """(whether the learner says stop, the rest of its line); also the heartbeat, every BEAT_S."""
        if (self.parent_pid is not None and os.getppid() != self.parent_pid) or \
                (self.inbox is not None and self.inbox.error is not None):
            raise LearnerGone("the learner is gone (its process or connection ended)")
        try:
            stop, *rest = map(int, self.store.get("learner").split())
            if time.monotonic() - self._beat > BEAT_S:
                self.store.add(f"beat/{self.rank}", 1)
                self._beat = time.monotonic()
        except (RuntimeError, ValueError) as e:
            raise LearnerGone(f"the learner's store stopped answering: {e}") from e
        return bool(stop), rest


def exit_now(code: int) -> None:
    """End this process at once with `code`, output flushed, without the interpreter's teardown,
    which aborts while gloo's threads still sit in a receive."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _local_host(rendezvous, rank, build, build_args, seed, threads, parent_pid):
    """A local stand-in for a host: its own session, stopped if the learner's process ends.
    Exit code 0 when told to stop, 3 when the learner went away, 1 on its own failure."""
    from fnrl.run.stop import leave_signals_to_parent
    from fnrl.samplers.async_ import set_process_name

    os.setsid()
    leave_signals_to_parent()
    set_process_name(PROCESS_NAME)
    try:
        host_main(rendezvous, rank, build, build_args, seed=seed, threads=threads, parent_pid=parent_pid)
    except LearnerGone:
        exit_now(3)
    except BaseException as e:  # noqa: BLE001 - one line; the learner has it from the store too
        print(f"fnrl actor {rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        exit_now(1)
    exit_now(0)


def host_main(rendezvous: Rendezvous, rank: int, build: Callable, build_args: tuple, *, seed: int = 0,
              threads: int | None = 1, parent_pid: int | None = None) -> None:
    """Run host `rank` until the learner says stop: build, say ready, join, run the loop.

    build(*build_args, rank - 1) -> (env, loop), run here; loop(link: LearnerLink) returns when
    the learner says stop. Raises `LearnerGone` when the learner's store or connection is gone;
    any other failure is also reported to the learner (store key error/RANK) before it is raised.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    rng.seed_everything(seed, rank, stream=rng.WORKER)
    store, env = rendezvous.store(rank), None
    try:
        env, loop = build(*build_args, rank - 1)
        store.set(f"ready/{rank}", "1")
        rendezvous.join(rank, store)
        link = LearnerLink(store, rank, parent_pid)
        try:
            loop(link)
        finally:
            link.close()
        store.set(f"done/{rank}", "1")
    except LearnerGone:
        raise
    except BaseException as e:
        try:
            store.set(f"error/{rank}", f"actor {rank}: {type(e).__name__}: {e}".splitlines()[0])
        except Exception:  # noqa: BLE001
            pass
        raise
    finally:
        if env is not None:
            env.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def run_host(rendezvous: Rendezvous, rank: int, build: Callable, build_args: tuple, *, seed: int = 0,
             threads: int | None = 1) -> None:
    """Rank `rank` > 0 of a torchrun launch: `host_main` until the learner stops, then end the
    process (exit code 0, or 1 with one line on stderr when the learner went away first or the
    host failed); the learner logs and reports."""
    try:
        host_main(rendezvous, rank, build, build_args, seed=seed, threads=threads)
    except Exception as e:  # noqa: BLE001 - the learner is gone, or this host failed: one line, then out
        print(f"fnrl: actor host {rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        exit_now(1)
    exit_now(0)   # the rank's process only acts
