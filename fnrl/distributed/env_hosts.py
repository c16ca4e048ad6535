"""Env hosts: central inference across machines over torch.distributed (SEED RL).

    learner (rank 0)                                   env host k (rank k = 1..N)
    ----------------                                   --------------------------
    wire.Inbox per host (a thread): requests    <-----  obs [B] + the last step's reward, done,
      onto one queue                                      valid, episode stats (one message)
    inference thread: the first request, then           receives its actions (blocking; a
      up to `batch_wait_s` for the other live           thread heartbeats meanwhile)
      hosts; one `act` forward for all of them
      sends each host its actions [B]           ----->  env.step(action)
    `_Trajectory` per host: rows filled from
      the requests and the forward's replies;
      every T steps one onto the queue `get` pops

Espeholt et al. 2020, "SEED RL: Scalable and Efficient Deep-RL with Accelerated Central
Inference". The hosts step only envs; the policy runs on the learner (its device), batched
over every host that asked within `batch_wait_s` of the first, so a slow host does not stall
the rest. Trajectories for V-trace are assembled on the learner, shaped exactly as the
one-machine `fnrl.samplers.central.CentralSampler`'s (the behaviour log-probabilities, the
carry and the policy version never travel): `EnvHosts` has that sampler's interface, and
`fnrl.train_central` runs either. Env j of host k is seeded
`fnrl.rng.env_seeds(seed, N * B)[(k - 1) * B + j]`, the seeds of actor k - 1 on one machine.

Back-pressure: while `num_slots - live hosts` full trajectories wait for the learner, the
inference thread answers nobody, so the hosts wait for their actions. Stop: the learner answers
every request with a header whose count is `STOP`, and each host returns. Rendezvous, launch,
liveness and the rest of stopping are `fnrl.distributed.hosts`'; a dropped host's unfinished
trajectory is discarded and counted (`columns()["discarded"]`), and training goes on with the
others.
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Callable

import torch
from tensordict import TensorDict

from fnrl.distributed import wire
from fnrl.distributed.hosts import POLL_S, HostGroup, LearnerGone, LearnerLink, Rendezvous
from fnrl.samplers.central import (STEP_DTYPES, ActorError, BatchedInference, pop, trajectory_batch,
                                   trajectory_buffers)

__all__ = ["EnvHosts", "STOP", "stepping_loop"]

STOP = -1
"""The count of the header (no body) the learner answers a request with once it stops."""


def _request(obs: torch.Tensor, step: dict | None = None) -> dict:
    """A host's request: its envs' observations [B, *obs] and the step that led to them
    (`STEP_DTYPES`' fields [B]; zeros before the first step)."""
    B = obs.shape[0]
    fields = {"obs": obs}
    for k, dtype in STEP_DTYPES.items():
        fields[k] = torch.zeros(B, dtype=dtype) if step is None else step[k].to(dtype)
    return fields


class _Trajectory:
    """One host's [T, B] trajectory being filled on the learner, a step at a time."""

    def __init__(self, buffers: dict):
        self.buffers, self.t = buffers, 0
        self.horizon = buffers["reset"].shape[0]

    def begin(self, obs: torch.Tensor) -> None:
        self.buffers["obs"][0], self.t = obs, 0

    def acted(self, reply: dict, version: int, reset: torch.Tensor) -> None:
        """Row t's action and extras, the version that chose them, and which observations start an episode."""
        for k, v in reply.items():
            self.buffers[k][self.t] = v
        self.buffers["version"][self.t] = version
        self.buffers["reset"][self.t] = reset

    def stepped(self, request: dict) -> dict | None:
        """Row t's step results and next observation; a copy of the trajectory once it has T rows."""
        for k in STEP_DTYPES:
            self.buffers[k][self.t] = request[k]
        self.t += 1
        self.buffers["obs"][self.t] = request["obs"]
        if self.t < self.horizon:
            return None
        full = {k: v.clone() for k, v in self.buffers.items()}
        self.begin(request["obs"])
        return full


class EnvHosts:
    """The learner's side of N env hosts, with `fnrl.samplers.central.CentralSampler`'s interface
    (`start`, `get`, `set_state`, `check`, `close`, `forwards`, `requests`, `batch_sizes`,
    `columns`).

    act, state, obs_shape, obs_dtype, device, explore: as `CentralSampler`'s; num_envs: B per host;
    horizon: T; num_slots: trajectories in flight: while `num_slots` minus the live hosts are queued,
    no host is answered (so at most that many queued, plus one being filled per host);
    batch_wait_s: after the first request, how long the inference thread waits for the other
    live hosts' requests; stall_timeout_s: `get` raises `ActorError` when no trajectory arrives
    for this long (the first gets the rendezvous timeout).
    rendezvous, spawn, host_timeout: the `fnrl.distributed.hosts.HostGroup`'s (spawn's build
    returns (env, `stepping_loop(env)`)).
    """

    def __init__(self, act: Callable, state, *, hosts: int, num_envs: int, horizon: int, obs_shape: tuple,
                 obs_dtype: torch.dtype, num_slots: int | None = None, batch_wait_s: float = 0.002,
                 device: str | torch.device = "cpu", explore: bool = True, stall_timeout_s: float = 120.0,
                 rendezvous: Rendezvous | None = None, spawn: tuple | None = None, host_timeout: float = 60.0):
        self.hosts, self.num_envs, self.horizon, self.device = hosts, num_envs, horizon, torch.device(device)
        self.num_slots = max(num_slots or 2 * hosts, hosts)
        self.batch_wait_s, self.stall_timeout_s = batch_wait_s, stall_timeout_s
        self.group = HostGroup(hosts, rendezvous, spawn, host_timeout)
        self.inference = BatchedInference(act, state, hosts, num_envs, obs_shape, obs_dtype, self.device, explore)
        self.request_layout = wire.Layout.of(_request(torch.zeros((num_envs, *obs_shape), dtype=obs_dtype)))
        self.action_layout = wire.Layout.of({"action": self.inference.example["action"]})
        self._building = {k: _Trajectory(trajectory_buffers(horizon, num_envs, obs_shape, obs_dtype,
                                                            self.inference.example)) for k in range(1, hosts + 1)}
        self._requests: queue.Queue = queue.Queue()
        self._full: queue.Queue = queue.Queue()
        self.trajectories = self.discarded = 0
        self._error: BaseException | None = None
        self._stopping = False   # answer every request with STOP
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    forwards = property(lambda self: self.inference.forwards, doc="inference forward passes so far")
    requests = property(lambda self: self.inference.requests, doc="host requests served so far")
    batch_sizes = property(lambda self: self.inference.batch_sizes, doc="requests per forward (the last 10,000)")

    @property
    def bytes_per_step(self) -> float:
        """Bytes on the wire per env step, both ways, headers included."""
        return (self.request_layout.size + self.action_layout.size) / self.num_envs

    def columns(self) -> dict:
        """Extra columns of a log row: live hosts, hosts lost, unfinished trajectories discarded."""
        return {"actors": len(self.group.live), "actors_lost": self.group.lost, "discarded": self.discarded}

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "EnvHosts":
        """Start (or wait for) the hosts, agree on the layouts, start receiving and serving. A
        SamplerError, with the host's own error where it reported one, if a host fails or they
        do not all arrive within the rendezvous timeout; then call `close`."""
        group = self.group
        group.open()
        group.tell(0)
        for k in sorted(group.live):
            wire.send_layout(self.action_layout, k)
        group.receive(self.request_layout, self._deliver, "requests")
        self._thread = threading.Thread(target=self._serve, name="fnrl-inference", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Answer every request with STOP until each live host says it has stopped, then stop
        serving and let them go (`HostGroup.close`). Idempotent; never raises."""
        deadline = time.monotonic() + timeout
        self._stopping = True
        try:
            if self.group.store is not None:
                self.group.tell(1)
        except Exception:  # noqa: BLE001
            pass
        if self._thread is None and self.group.inboxes:   # start failed half-way: answer the hosts anyway
            self._thread = threading.Thread(target=self._serve, name="fnrl-inference", daemon=True)
            self._thread.start()
        self.group.wait_done(timeout)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.group.leave(deadline)

    # ---- the learner's loop -----------------------------------------------------------------
    def set_state(self, state, version: int) -> None:
        """Serve `state` (policy version `version`) from the next forward on."""
        self.inference.set_state(state, version)

    def get(self, n: int) -> TensorDict:
        """Pop `n` trajectories: a TensorDict [T, n * num_envs] (`CentralSampler.get`'s fields).
        Raises ActorError if the inference thread failed, every host is gone, or nothing arrived for
        `stall_timeout_s` (the first one gets the rendezvous timeout)."""
        limit = self.group.rendezvous.timeout_s if self.trajectories == 0 else self.stall_timeout_s
        out = pop(self._full, n, self.check, limit, self.stall_timeout_s, f"the {len(self.group.live)} env hosts")
        self.trajectories += n
        return trajectory_batch(out, self.device)

    def check(self) -> None:
        """Drop the hosts that died or went silent (their unfinished trajectory is discarded and
        counted); raise ActorError (one line) if the inference thread failed or every host is gone."""
        if self._error is not None:
            raise ActorError(f"central inference failed: {type(self._error).__name__}: "
                             f"{str(self._error).splitlines()[0] if str(self._error) else ''}; the env hosts are "
                             f"told to stop") from self._error
        for k in self.group.drop_gone():
            with self.group.lock:
                self.discarded += int(self._building[k].t > 0)
        if not self.group.live:
            raise ActorError(str(self.group.all_gone()))

    # ---- the inference thread ------------------------------------------------------------------
    def _deliver(self, k: int, count: int, fields: dict) -> None:
        """An inbox's delivery (on its thread): host k's request, for the inference thread."""
        with self.group.lock:
            self.group.heard(k)
        self._requests.put((k, count, fields))

    def _serve(self) -> None:
        """Answer requests until `_stop`: with actions, or with STOP once stopping, after a failure
        (which check() reports in the learner's thread), and to a host already dropped."""
        while not self._stop.is_set():
            stopping = self._stopping or self._error is not None
            try:
                if not stopping and self._full.qsize() >= max(self.num_slots - len(self.group.live), 1):
                    time.sleep(POLL_S)   # the learner is behind: the hosts wait for their actions
                    continue
                pending = self._gather()
                for k in [k for k in pending if stopping or k not in self.group.live]:
                    self._send(k, None, STOP)
                    del pending[k]
                if pending:
                    self._answer(pending)
            except BaseException as e:  # noqa: BLE001
                if self._error is not None:   # failing again while answering STOP: give up
                    return
                self._error = e

    def _gather(self) -> dict:
        """The requests that arrive within `batch_wait_s` of the first (or until every live host has
        asked): {k: (count, fields)}."""
        try:
            k, count, fields = self._requests.get(timeout=0.2)
        except queue.Empty:
            return {}
        pending = {k: (count, fields)}
        deadline = time.monotonic() + self.batch_wait_s
        while len(pending) < len(self.group.live):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                k, count, fields = self._requests.get(timeout=left)
            except queue.Empty:
                break
            pending[k] = (count, fields)
        return pending

    def _answer(self, pending: dict) -> None:
        """Record each request's step, act for all of them in one forward, record and send the actions."""
        ids, resets = sorted(pending), []
        for k in ids:
            count, request = pending[k]
            if count == 0:   # the envs' first observations
                self._building[k].begin(request["obs"])
                resets.append(torch.ones(self.num_envs, dtype=torch.bool))
            else:
                full = self._building[k].stepped(request)
                if full is not None:
                    self._full.put(full)
                resets.append(~request["valid"])
        obs = torch.cat([pending[k][1]["obs"] for k in ids])
        reply, version = self.inference([k - 1 for k in ids], obs, torch.cat(resets))
        B = self.num_envs
        for j, k in enumerate(ids):
            mine = {name: v[j * B:(j + 1) * B] for name, v in reply.items()}
            self._building[k].acted(mine, version, resets[j])
            self._send(k, self.action_layout.pack({"action": mine["action"]}), pending[k][0])

    def _send(self, k: int, body: torch.Tensor | None, count: int) -> None:
        """Host k's answer (a header alone without `body`); a failed send marks the host failed."""
        try:
            if body is None:
                wire.send_signal(self.action_layout, k, count)
            else:
                wire.send_packed(body, self.action_layout, k, count)
        except RuntimeError:   # it died: check() drops it
            self.group.failed.add(k)


# ---- the host's side -------------------------------------------------------------------------------
def stepping_loop(env):
    """An env host's loop (`fnrl.distributed.hosts.host_main`'s `loop`): send the learner the
    observations of `env` (a `fnrl.envs` vector env), step it with the actions it returns; returns
    when the learner says stop."""
    return functools.partial(_step, env=env)


def _step(link: LearnerLink, *, env) -> None:
    action_layout = wire.recv_layout(0)
    request = _request(env.reset()["obs"])
    layout = wire.Layout.of(request)
    wire.send_layout(layout, 0)
    link.keep_beating()
    count = 0
    while True:
        try:
            wire.send(request, layout, 0, count)
            _, answer, fields = wire.recv(action_layout, 0)
            if answer == STOP:
                return
        except wire.WireError:
            raise
        except RuntimeError as e:
            raise LearnerGone(f"the learner is gone: {e}") from e
        count += 1
        step = env.step(fields["action"])
        request = _request(step["obs"], step)
