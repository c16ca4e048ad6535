"""Actor hosts: off-policy actors on other machines feed the learner's replay over torch.distributed (Ape-X).

    learner (rank 0)                                   actor host k (rank k = 1..N)
    ----------------                                   ----------------------------
    TCPStore server, key "learner": stop,       <--->  reads it before every collect (throttle,
      updates, can_sample, env steps received            epsilon schedule, stop); heartbeats
    wire.Inbox per actor (a thread): replay     <-----  SerialSampler.collect [T, B]; wire.send
      shard k - 1 .add on arrival
    publish(params, version): wire.Outbox       ----->  wire.Inbox (a thread) keeps the newest;
      per actor (the newest replaces one unsent)         copied in between collects

Horgan et al. 2018, "Distributed Prioritized Experience Replay". Each actor host steps its own
envs with a CPU copy of the acting parameters (env seeds `fnrl.rng.env_seeds(seed, B, rank=k - 1)`)
and sends every rollout to the learner as one `fnrl.distributed.wire` message (the rollout's
fields but next_obs, the parameter version it acted with and its seconds spent waiting):
tensors only, nothing is unpickled. The learner samples its replay without waiting for any
actor. Every actor evaluates the one-machine async sampler's `Throttle` on the learner's
update count and the env steps it has received, so the updates per env step are the serial
loop's; the lead is bounded per actor, so N actors may together run up to N collects past it.
A slow actor skips parameter versions instead of holding the learner.

Faults. An actor that dies (its local process exits or its connection closes), or that is not
heard from (heartbeat or delivery) for `actor_timeout` s, is dropped: its half-arrived message
is discarded and counted, and training goes on with the others (`read()["actors_lost"]`); the
run fails only when every actor is gone, or when one fails before the run starts. The store
server lives in the learner's process, so the learner's death makes every actor's next store
read (before each collect, every `POLL_S` while it waits) or send fail, and the actor exits. At
the end the learner waits for every live actor to confirm the stop. A dropped actor does not
rejoin (its rank's place in the process group is fixed at the rendezvous).

Launch: `ActorHosts(..., spawn=...)` starts the N actors as local processes, each in a session of
its own, meeting over loopback: the one-machine stand-in for N hosts that tests use. On real
hosts the same `actor_main` runs as ranks 1..N of a torchrun job, rank 0 the learner.
"""
from __future__ import annotations

import collections
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
from tensordict import TensorDict

from fnrl import rng
from fnrl.distributed import wire
from fnrl.errors import ConfigError, SamplerError
from fnrl.run.threads import environ

__all__ = ["ActorHosts", "LearnerGone", "Rendezvous", "actor_main", "exit_now", "free_port", "torchrun_rendezvous"]

POLL_S = 0.01
"""Longest wait of an actor between two looks at the store (stop, throttle, the learner alive)."""
BEAT_S = 0.5
"""Seconds between two heartbeats of an actor in the store."""
SEP = "."
PROCESS_NAME = b"fnrl-actor"
"""A local actor host's OS-level name (`ps`, /proc/PID/comm) on Linux."""


PORT_VAR = "FNRL_ACTOR_PORT"
"""The learner's store port under torchrun (default: torchrun's MASTER_PORT + 1)."""


def torchrun_rendezvous(hosts: int) -> tuple[Rendezvous, int] | None:
    """Under torchrun (WORLD_SIZE > 1): the rendezvous of a run with `hosts` actor hosts (the
    learner, rank 0, serves it at MASTER_ADDR, port $FNRL_ACTOR_PORT or MASTER_PORT + 1) and this
    process's rank; None outside torchrun. A ConfigError unless there are hosts + 1 ranks."""
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
    """how long joining may take; an established connection never times out (a throttled actor
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


def _message(rollout: TensorDict, version: int, wait_s: float) -> dict:
    """A rollout's message: its fields but next_obs (the replay takes it from the next row), the
    parameter version it was collected with and the actor's seconds spent waiting so far."""
    fields = dict(rollout.exclude("next_obs").flatten_keys(SEP).items())
    fields["version"] = torch.tensor(version, dtype=torch.int64)
    fields["wait_s"] = torch.tensor(wait_s, dtype=torch.float64)
    return fields


def _flat(td: TensorDict) -> dict:
    return dict(td.flatten_keys(SEP).items())


class ActorHosts:
    """The learner's side of N actor hosts, with `fnrl.samplers.async_.AsyncSampler`'s interface
    (`start`, `read`, `returns_since`, `check`, `notify`, `wait_for_data`, `stop`) and
    `publish(params, version)` in place of its `SharedParams`.

    replay: an object with `add(rollout, shard)` that locks itself (a `fnrl.replay.sharded.ShardedReplay`):
      actor k's [T, B] rollouts go to shard k - 1, so no two actors' rows interleave.
    params: the acting TensorDict (its layout is agreed with every actor); version: its update
      count, the first copy the actors get. example: a [T, B] rollout of one actor (its layout is
      the rollout message's). total_steps: env steps to receive (the actors stop then);
      start_env_steps: the count to start from (resume).
    spawn: (build, build_args, device, seed, threads) to start the actors as local processes
      (`actor_main`); None: they are started elsewhere (torchrun) and join `rendezvous`.
    actor_timeout: seconds without a heartbeat or a delivery before an actor is dropped.
    """

    def __init__(self, replay, params: TensorDict, example: TensorDict, *, hosts: int,
                 total_steps: int, start_env_steps: int = 0, rendezvous: Rendezvous | None = None,
                 spawn: tuple | None = None, actor_timeout: float = 60.0, version: int = 0):
        self.replay, self.total_steps = replay, total_steps
        self.rendezvous = rendezvous or Rendezvous("127.0.0.1", free_port(), hosts + 1, interface=wire.LOOPBACK)
        self.params, self.version = params, version
        self.params_layout = wire.Layout.of(_flat(params.detach().cpu()))
        self.layout = wire.Layout.of(_message(example, 0, 0.0))
        self.batch_size = example.batch_size
        self.spawn, self.actor_timeout, self.hosts = spawn, actor_timeout, hosts
        self.processes: dict[int, mp.Process] = {}
        self.live: set[int] = set()
        self.lost, self.discarded, self.env_steps, self.episodes = 0, 0, start_env_steps, 0
        self.returns: collections.deque = collections.deque(maxlen=4096)
        self.versions: dict[int, int] = {}
        self.waits: dict[int, float] = {}
        self.beats: dict[int, int] = {}
        self.heard: dict[int, float] = {}
        self.inboxes: dict[int, wire.Inbox] = {}
        self.outboxes: dict[int, wire.Outbox] = {}
        self.lock, self._tell_lock = threading.Lock(), threading.Lock()
        self.store = None
        self.done = False
        self._told: tuple = (-1, False)
        self._looked = 0.0

    # ---- start --------------------------------------------------------------------------
    def start(self) -> None:
        """Serve the store, start (or wait for) the actors, agree on the layouts, send the first
        parameters and start receiving. A SamplerError, with the actor's own error where it
        reported one, if an actor fails or the actors do not all arrive within the rendezvous
        timeout; the caller then calls `stop`."""
        r = self.rendezvous
        if self.spawn is not None:
            ctx = mp.get_context("spawn")
            for k in range(1, self.hosts + 1):
                self.processes[k] = ctx.Process(target=_local_actor, name=f"fnrl-actor-{k}", daemon=True,
                                                args=(r, k, *self.spawn, os.getpid()))
                self.processes[k].start()
        self.store = r.store(0)
        self._wait_until_ready()
        r.join(0, self.store)
        self.notify(0, False)
        self.live = set(range(1, self.hosts + 1))
        for k in sorted(self.live):
            wire.send_layout(self.params_layout, k)
            self.outboxes[k] = wire.Outbox(self.params_layout, k)
        self.publish(self.params, self.version)
        for k in sorted(self.live):
            theirs = wire.recv_layout(k)
            if theirs != self.layout:
                raise SamplerError(f"actor {k} sends rollouts of another layout ({theirs.names}); every rank must "
                                   f"run the same fnrl version and options")
            self.beats[k], self.heard[k] = -1, time.monotonic()
            self.inboxes[k] = wire.Inbox(self.layout, k, functools.partial(self._add, k))

    def _wait_until_ready(self) -> None:
        """Wait until every actor has built its envs and policy (its "ready" key), failing fast on an
        actor's reported error or a local actor's exit, or after the rendezvous timeout."""
        keys = [f"ready/{k}" for k in range(1, self.hosts + 1)]
        deadline = time.monotonic() + self.rendezvous.timeout_s
        while not self.store.check(keys):
            errors = self._errors()
            exited = [k for k, p in self.processes.items() if p.exitcode is not None]
            if errors or exited:
                raise SamplerError(f"an actor host failed before the run started: "
                                   f"{errors[0] if errors else f'actor {exited[0]} exited'}")
            if time.monotonic() > deadline:
                raise SamplerError(f"the {self.hosts} actor hosts did not all arrive within "
                                   f"{self.rendezvous.timeout_s:.0f} s")
            time.sleep(POLL_S)

    def _errors(self) -> list[str]:
        """The one-line errors the actors have reported in the store, by rank."""
        keys = [f"error/{k}" for k in range(1, self.hosts + 1)]
        return [self.store.get(key).decode() for key in keys if self.store.check([key])]

    # ---- the learner's loop -----------------------------------------------------------------
    def publish(self, params: TensorDict, version: int) -> None:
        """Send the acting parameters to every live actor (the newest replaces one not yet sent)."""
        body = self.params_layout.pack(_flat(params.detach()))
        for k in sorted(self.live):
            self.outboxes[k].put(body, version)

    def read(self) -> dict:
        """Counters: env steps received, episodes, the oldest parameter version a live actor acted
        with, done, the actors' mean seconds waiting, live / lost actors, discarded messages."""
        with self.lock:
            return {"env_steps": self.env_steps, "episodes": self.episodes,
                    "version": min((self.versions.get(k, self.version) for k in self.live), default=self.version),
                    "done": self.done, "wait_s": sum(self.waits.values()) / self.hosts, "actors": len(self.live),
                    "actors_lost": self.lost, "discarded": self.discarded}

    def returns_since(self, episodes: int) -> list[float]:
        with self.lock:
            new = self.episodes - episodes
            return list(self.returns)[-new:] if new > 0 else []

    def notify(self, updates: int, can_sample: bool) -> None:
        """Tell the actors the learner's update count and whether it could sample (their throttle)."""
        told = (updates, bool(can_sample))
        if told != self._told:
            self._told = told
            self._tell()

    def _tell(self) -> None:
        """Write what the actors read, in one store key: "stop updates can_sample env_steps". The
        line is made and written under one lock, so an older line never lands after a newer one."""
        with self._tell_lock:
            with self.lock:
                updates, can_sample = self._told
                line = f"{int(self.done)} {updates} {int(can_sample)} {self.env_steps}"
            self.store.set("learner", line)

    def wait_for_data(self, timeout: float = 0.05) -> None:
        start, deadline = (self.env_steps, self.done), time.monotonic() + timeout
        while (self.env_steps, self.done) == start and time.monotonic() < deadline:
            time.sleep(0.002)

    def check(self) -> None:
        """Drop the actors that died or were not heard from for `actor_timeout` s; raise
        SamplerError if every actor is gone."""
        now = time.monotonic()
        look = now - self._looked > BEAT_S
        self._looked = now if look else self._looked
        for k in sorted(self.live):
            if self.done:
                break
            p, inbox = self.processes.get(k), self.inboxes[k]
            dead = (p is not None and p.exitcode is not None) or inbox.error is not None \
                or self.outboxes[k].error is not None
            beat = int(self.store.add(f"beat/{k}", 0)) if look else self.beats[k]
            with self.lock:
                if beat != self.beats[k]:
                    self.beats[k], self.heard[k] = beat, now
                if dead or now - self.heard[k] > self.actor_timeout:
                    self.live.discard(k)
                    self.lost += 1
                    self.discarded += int(inbox.partial)
        if not self.live and not self.done:
            errors = self._errors()
            raise SamplerError(f"every actor host is gone ({self.lost} lost; "
                               f"{errors[0] if errors else 'none reported an error'}); the learner gets no more data")

    def _add(self, k: int, count: int, fields: dict) -> None:
        """An inbox's delivery (on its thread): the rollout into actor k's shard, the counters."""
        version, wait_s = int(fields.pop("version")), float(fields.pop("wait_s"))
        rollout = TensorDict(fields, batch_size=self.batch_size).unflatten_keys(SEP)
        returns = rollout["episode_return"][rollout["episode_end"]].tolist()
        with self.lock:   # one delivery at a time: none lands after the last one counted
            if self.done:
                return
            if k not in self.live:   # from an actor dropped for silence that still runs
                self.discarded += 1
                return
            self.replay.add(rollout, k - 1)
            self.env_steps += rollout.numel()
            self.episodes += len(returns)
            self.returns.extend(returns)
            self.versions[k], self.waits[k], self.heard[k] = version, wait_s, time.monotonic()
            self.done = self.env_steps >= self.total_steps
        self._tell()

    # ---- stop -----------------------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> None:
        """Tell the actors to stop and wait up to `timeout` s for each live one to say it has (so
        none finds the learner gone mid-send), then join (or kill) local actors and leave the
        process group. Never raises."""
        self.done = True
        deadline = time.monotonic() + timeout
        try:
            if self.store is not None:
                self._tell()
                keys = [f"done/{k}" for k in sorted(self.live)]
                while keys and not self.store.check(keys) and time.monotonic() < deadline:
                    time.sleep(POLL_S)
        except Exception:  # noqa: BLE001
            pass
        for p in self.processes.values():
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.is_alive():
                p.kill()
                p.join(timeout)
        for outbox in self.outboxes.values():   # no thread left inside the process group it leaves
            outbox.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None


# ---- the actor's side ------------------------------------------------------------------------------
class LearnerGone(SamplerError):
    """An actor host's learner stopped answering (its store or connection is gone)."""


def exit_now(code: int) -> None:
    """End this process at once with `code`, output flushed, without the interpreter's teardown,
    which aborts while gloo's threads still sit in a receive."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _local_actor(rendezvous, rank, build, build_args, device, seed, threads, parent_pid):
    """A local stand-in for an actor host: its own session, stopped if the learner's process ends.
    Exit code 0 when told to stop, 3 when the learner went away, 1 on its own failure."""
    from fnrl.run.stop import leave_signals_to_parent
    from fnrl.samplers.async_ import set_process_name

    os.setsid()
    leave_signals_to_parent()
    set_process_name(PROCESS_NAME)
    try:
        actor_main(rendezvous, rank, build, build_args, device=device, seed=seed, threads=threads,
                   parent_pid=parent_pid)
    except LearnerGone:
        exit_now(3)
    except BaseException as e:  # noqa: BLE001 - one line; the learner has it from the store too
        print(f"fnrl actor {rank}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        exit_now(1)
    exit_now(0)


def actor_main(rendezvous: Rendezvous, rank: int, build: Callable, build_args: tuple, *, device: str = "cpu",
               seed: int = 0, threads: int | None = 1, parent_pid: int | None = None) -> None:
    """Run actor host `rank` until the learner says stop: build, join, agree on the layouts,
    then collect [T, B] rollouts with the newest parameters and send each to rank 0.

    build(*build_args, rank - 1) -> (env, act, state, throttle, horizon), run here. Raises
    `LearnerGone` when the learner's store or connection is gone; any other failure is also
    reported to the learner (store key error/RANK) before it is raised.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    rng.seed_everything(seed, rank, stream=rng.WORKER)
    store, env = rendezvous.store(rank), None
    try:
        env, act, state, throttle, horizon = build(*build_args, rank - 1)
        store.set(f"ready/{rank}", "1")
        rendezvous.join(rank, store)
        _act(store, rank, env, act, state, throttle, horizon, torch.device(device), parent_pid)
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


def _act(store, rank: int, env, act, state, throttle, horizon: int, device, parent_pid) -> None:
    """`actor_main`'s loop, once joined: returns when the learner says stop."""
    from fnrl.samplers.serial import SerialSampler

    params_layout = wire.recv_layout(0)
    flat = _flat(state)
    missing = [n for n in params_layout.names if n not in flat]
    if missing:
        raise wire.WireError(f"the learner's parameters {missing} are not in this actor's state")
    acting = {n: flat[n] for n in params_layout.names}
    latest: list = [None]   # (version, fields): the newest parameters the inbox has delivered
    inbox = wire.Inbox(params_layout, 0, lambda count, fields: latest.__setitem__(0, (count, fields)))
    sampler, version, count, waited, layout = SerialSampler(env, act, horizon, device=device), -1, 0, 0.0, None
    beat = [0.0]

    def look() -> tuple[int, int, bool]:
        """(env steps the learner has, its updates, whether it could sample); steps -1: stop.
        Also the heartbeat, every BEAT_S."""
        if (parent_pid is not None and os.getppid() != parent_pid) or inbox.error is not None:
            raise LearnerGone("the learner is gone (its process or connection ended)")
        try:
            stop, updates, can_sample, steps = map(int, store.get("learner").split())
            if time.monotonic() - beat[0] > BEAT_S:
                store.add(f"beat/{rank}", 1)
                beat[0] = time.monotonic()
        except (RuntimeError, ValueError) as e:
            raise LearnerGone(f"the learner's store stopped answering: {e}") from e
        return -1 if stop else steps, updates, bool(can_sample)

    with torch.no_grad():
        while True:
            t = time.monotonic()
            steps, updates, can_sample = look()
            while steps >= 0 and (latest[0] is None or throttle.sampler_must_wait(steps, updates, can_sample)):
                time.sleep(POLL_S)
                steps, updates, can_sample = look()
            if steps < 0:
                return
            waited += time.monotonic() - t
            newest = latest[0]
            if newest[0] != version:
                version = newest[0]
                for n, v in newest[1].items():
                    acting[n].copy_(v)
            state["env_steps"].fill_(steps)
            message = _message(sampler.collect(state), version, waited)
            if layout is None:
                layout = wire.Layout.of(message)
                wire.send_layout(layout, 0)
            try:
                wire.send(message, layout, 0, count)
            except RuntimeError as e:
                raise LearnerGone(f"sending to the learner failed: {e}") from e
            count += 1
