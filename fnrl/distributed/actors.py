"""Actor hosts: off-policy actors on other machines feed the learner's replay over torch.distributed (Ape-X).

    learner (rank 0)                                   actor host k (rank k = 1..N)
    ----------------                                   ----------------------------
    the store's line "learner": stop, updates,  <--->  reads it before every collect (throttle,
      can_sample, env steps received                     epsilon schedule, stop)
    wire.Inbox per actor (a thread): replay     <-----  SerialSampler.collect [T, B]; wire.send
      shard k - 1 .add on arrival
    publish(params, version): wire.Outbox       ----->  wire.Inbox (a thread) keeps the newest;
      per actor (the newest replaces one unsent)         copied in between collects

Horgan et al. 2018, "Distributed Prioritized Experience Replay". Each actor host steps its own
envs with a CPU copy of the acting parameters (env seeds `fnrl.rng.env_seeds(seed, B, rank=k - 1)`)
and sends every rollout to the learner as one `fnrl.distributed.wire` message (the rollout's
fields but next_obs, the parameter version it acted with, its seconds spent waiting and, with
prioritized replay, the initial priorities of the rows it completes, `WindowPriorities`):
tensors only, nothing is unpickled. The learner samples its replay without waiting for any
actor. Every actor evaluates the one-machine async sampler's `Throttle` on the learner's
update count and the env steps it has received, so the updates per env step are the serial
loop's; the lead is bounded per actor, so N actors may together run up to N collects past it.
A slow actor skips parameter versions instead of holding the learner.

Rendezvous, launch (local processes or torchrun ranks), liveness and stop are
`fnrl.distributed.hosts`'; a message that arrives from a dropped actor is discarded and counted,
and training goes on with the others (`read()["actors_lost"]`); the run fails only when every actor
is gone, or when one fails before the run starts.
"""
from __future__ import annotations

import collections
import functools
import threading
import time

import torch
from tensordict import TensorDict

from fnrl.distributed import wire
from fnrl.distributed.hosts import POLL_S, HostGroup, LearnerGone, LearnerLink, Rendezvous

__all__ = ["ActorHosts", "WindowPriorities", "acting_loop"]

SEP = "."


def _message(rollout: TensorDict, version: int, wait_s: float, priority: torch.Tensor | None = None) -> dict:
    """A rollout's message: its fields but next_obs (the replay takes it from the next row), the
    parameter version it was collected with, the actor's seconds spent waiting so far and, with
    actor-side priorities, the TD errors [T, B] of the rows this rollout completes."""
    fields = dict(rollout.exclude("next_obs").flatten_keys(SEP).items())
    fields["version"] = torch.tensor(version, dtype=torch.int64)
    fields["wait_s"] = torch.tensor(wait_s, dtype=torch.float64)
    if priority is not None:
        fields["priority"] = priority.to(torch.float32)
    return fields


class WindowPriorities:
    """An actor's initial priorities, Ape-X style: each rollout [T, B] completes the n-step
    windows of the buffer rows W - n .. W + T - 1 - n (W: rows its shard held before), so the
    actor keeps its last n stored rows and scores the window [n + T, B] with
    `priorities(params, window)` (`fnrl.algos.dqn.initial_priorities`). Before the first rollout
    the n rows are padding that ends episodes (done), so no real row's window reaches into it;
    their priorities are NaN, which the replay leaves out (its rows before them, if it holds any
    from a resumed run, keep theirs)."""

    KEYS = ("obs", "action", "reward", "terminated", "done")

    def __init__(self, priorities, n_step: int):
        self.priorities, self.n, self.tail, self.padding = priorities, n_step, None, n_step

    def __call__(self, params, rollout: TensorDict) -> torch.Tensor:
        rows = rollout.select(*self.KEYS)
        if self.tail is None:
            self.tail = rows[:1].expand(self.n, *rows.batch_size[1:]).clone()
            self.tail["done"].fill_(True)
        window = torch.cat([self.tail, rows], 0)
        self.tail = window[-self.n:].clone()
        td = self.priorities(params, window)
        td[:self.padding] = float("nan")
        self.padding = max(0, self.padding - rows.batch_size[0])
        return td


def _flat(td: TensorDict) -> dict:
    return dict(td.flatten_keys(SEP).items())


class ActorHosts:
    """The learner's side of N actor hosts, with `fnrl.samplers.async_.AsyncSampler`'s interface
    (`start`, `read`, `returns_since`, `check`, `notify`, `wait_for_data`, `stop`) and
    `publish(params, version)` in place of its `SharedParams`.

    replay: an object with `add(rollout, shard, priority=None)` that locks itself (a
      `fnrl.replay.sharded.ShardedReplay`): actor k's [T, B] rollouts go to shard k - 1, so no two
      actors' rows interleave. priorities: the actors send initial priorities (`WindowPriorities`)
      and the replay takes them in place of its largest priority.
    params: the acting TensorDict (its layout is agreed with every actor); version: its update
      count, the first copy the actors get. example: a [T, B] rollout of one actor (its layout is
      the rollout message's). total_steps: env steps to receive (the actors stop then);
      start_env_steps: the count to start from (resume).
    rendezvous, spawn, actor_timeout: the `fnrl.distributed.hosts.HostGroup`'s (spawn's build
      returns (env, `acting_loop(...)`)).
    """

    def __init__(self, replay, params: TensorDict, example: TensorDict, *, hosts: int,
                 total_steps: int, start_env_steps: int = 0, rendezvous: Rendezvous | None = None,
                 spawn: tuple | None = None, actor_timeout: float = 60.0, version: int = 0,
                 priorities: bool = False):
        self.replay, self.total_steps, self.hosts = replay, total_steps, hosts
        self.group = HostGroup(hosts, rendezvous, spawn, actor_timeout)
        self.params, self.version = params, version
        self.params_layout = wire.Layout.of(_flat(params.detach().cpu()))
        priority = torch.zeros(example.batch_size) if priorities else None
        self.layout = wire.Layout.of(_message(example, 0, 0.0, priority))
        self.batch_size = example.batch_size
        self.discarded, self.env_steps, self.episodes = 0, start_env_steps, 0
        self.returns: collections.deque = collections.deque(maxlen=4096)
        self.versions: dict[int, int] = {}
        self.waits: dict[int, float] = {}
        self.lock, self._tell_lock = self.group.lock, threading.Lock()
        self.done = False
        self._told: tuple = (-1, False)

    @property
    def processes(self) -> dict:
        """The local actor processes by rank (none under torchrun)."""
        return self.group.processes

    # ---- start --------------------------------------------------------------------------
    def start(self) -> None:
        """Start (or wait for) the actors, agree on the layouts, send the first parameters and start
        receiving. A SamplerError, with the actor's own error where it reported one, if an actor
        fails or the actors do not all arrive within the rendezvous timeout; then call `stop`."""
        group = self.group
        group.open()
        self.notify(0, False)
        for k in sorted(group.live):
            wire.send_layout(self.params_layout, k)
            group.outboxes[k] = wire.Outbox(self.params_layout, k)
        self.publish(self.params, self.version)
        group.receive(self.layout, self._add, "rollouts")

    # ---- the learner's loop -----------------------------------------------------------------
    def publish(self, params: TensorDict, version: int) -> None:
        """Send the acting parameters to every live actor (the newest replaces one not yet sent)."""
        flat = _flat(params.detach())
        for k in sorted(self.group.live):   # a message each: a send writes its header in place
            self.group.outboxes[k].put(self.params_layout.pack(flat), version)

    def read(self) -> dict:
        """Counters: env steps received, episodes, the oldest parameter version a live actor acted
        with, done, the actors' mean seconds waiting, live / lost actors, discarded messages."""
        live = self.group.live
        with self.lock:
            return {"env_steps": self.env_steps, "episodes": self.episodes,
                    "version": min((self.versions.get(k, self.version) for k in live), default=self.version),
                    "done": self.done, "wait_s": sum(self.waits.values()) / self.hosts, "actors": len(live),
                    "actors_lost": self.group.lost, "discarded": self.discarded}

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
        """Write the line the actors read: "stop updates can_sample env_steps". The line is made and
        written under one lock, so an older line never lands after a newer one."""
        with self._tell_lock:
            with self.lock:
                updates, can_sample = self._told
                line = (self.done, updates, can_sample, self.env_steps)
            self.group.tell(*line)

    def wait_for_data(self, timeout: float = 0.05) -> None:
        start, deadline = (self.env_steps, self.done), time.monotonic() + timeout
        while (self.env_steps, self.done) == start and time.monotonic() < deadline:
            time.sleep(0.002)

    def check(self) -> None:
        """Drop the actors that died or were not heard from for `actor_timeout` s; raise SamplerError
        if every actor is gone."""
        if self.done:
            return
        self.group.drop_gone()
        if not self.group.live and not self.done:
            raise self.group.all_gone()

    def _add(self, k: int, count: int, fields: dict) -> None:
        """An inbox's delivery (on its thread): the rollout into actor k's shard, the counters."""
        version, wait_s = int(fields.pop("version")), float(fields.pop("wait_s"))
        priority = fields.pop("priority", None)
        rollout = TensorDict(fields, batch_size=self.batch_size).unflatten_keys(SEP)
        returns = rollout["episode_return"][rollout["episode_end"]].tolist()
        with self.lock:   # one delivery at a time: none lands after the last one counted
            if self.done:
                return
            if k not in self.group.live:   # from an actor dropped for silence that still runs
                self.discarded += 1
                return
            self.replay.add(rollout, k - 1, priority)
            self.env_steps += rollout.numel()
            self.episodes += len(returns)
            self.returns.extend(returns)
            self.versions[k], self.waits[k] = version, wait_s
            self.group.heard(k)
            self.done = self.env_steps >= self.total_steps
        self._tell()

    # ---- stop -----------------------------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> None:
        """Tell the actors to stop, wait for them (`HostGroup.close`). Never raises."""
        self.done = True
        try:
            if self.group.store is not None:
                self._tell()
        except Exception:  # noqa: BLE001
            pass
        self.group.close(timeout)


# ---- the actor's side ------------------------------------------------------------------------------
def acting_loop(env, act, state, throttle, horizon: int, device: str = "cpu", priorities=None):
    """An actor host's loop (`fnrl.distributed.hosts.host_main`'s `loop`): collect [T, B] rollouts
    from `env` with `act` and the newest parameters, send each to rank 0; returns when the learner
    says stop. priorities: a `WindowPriorities` to send initial priorities with every rollout."""
    return functools.partial(_act, env=env, act=act, state=state, throttle=throttle, horizon=horizon,
                             device=torch.device(device), priorities=priorities)


def _act(link: LearnerLink, *, env, act, state, throttle, horizon: int, device, priorities=None) -> None:
    from fnrl.samplers.serial import SerialSampler

    params_layout = wire.recv_layout(0)
    flat = _flat(state)
    missing = [n for n in params_layout.names if n not in flat]
    if missing:
        raise wire.WireError(f"the learner's parameters {missing} are not in this actor's state")
    acting = {n: flat[n] for n in params_layout.names}
    latest: list = [None]   # (version, fields): the newest parameters the inbox has delivered
    link.inbox = wire.Inbox(params_layout, 0, lambda count, fields: latest.__setitem__(0, (count, fields)))
    sampler, version, count, waited, layout = SerialSampler(env, act, horizon, device=device), -1, 0, 0.0, None

    def look() -> tuple[int, int, bool]:
        """(env steps the learner has, its updates, whether it could sample); steps -1: stop."""
        stop, (updates, can_sample, steps) = link.look()
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
            rollout = sampler.collect(state)
            message = _message(rollout, version, waited,
                               None if priorities is None else priorities(state["params"], rollout))
            if layout is None:
                layout = wire.Layout.of(message)
                wire.send_layout(layout, 0)
            try:
                wire.send(message, layout, 0, count)
            except RuntimeError as e:
                raise LearnerGone(f"sending to the learner failed: {e}") from e
            count += 1
