"""Central batched inference with actor processes (SEED RL, Espeholt et al. 2020, arXiv:1910.06591).

Actor processes only step environments; the policy runs in the learner process, on the
learner's device, in one inference thread that batches the requests of all actors:

    actor i (process)                      learner process
    -----------------                      ---------------
    obs -> request slot i, byte on pipe i  inference thread: wait for the first request, then
    wait for the byte back                 up to `batch_wait_s` for the others (or all actors);
    read action (+ logp, carry, version)   one `act` forward on the concatenated observations;
    env.step(action)                       write each actor's rows back; a byte on each pipe
    every T steps: the trajectory slot ->  learner thread: `get(n)` pops n trajectories from the
      the full queue; take a free slot      full queue (a [T, n*B] TensorDict), frees their slots,
                                            updates, then `set_state(state, version)`

Transport: shared-memory tensors for observations, responses and trajectories; one duplex
pipe per actor for the request/response signal (an actor that dies closes its pipe, which
the server sees at once); two `multiprocessing.Queue`s of slot indices make the trajectory
queue bounded (`num_slots` trajectories in flight: an actor waits for a free slot when the
learner falls behind).

Trajectories are [T, B] TensorDicts shaped like fnrl's serial rollouts (see
fnrl.samplers.serial): `obs`, `next_obs` (views of one [T + 1, B] buffer), `action`,
`reward`, `terminated`, `truncated`, `done`, `valid`, `episode_end`, `episode_return`,
`episode_length`, `reset` (True where the observation starts an episode), every extra of
`act` (`logp`, and for recurrent policies `carry`: the state each step started from), and
`version` [T, B] int64: the policy version that chose each action.

Recurrent policies: the carry lives with the inference server, per actor and env, and is
reset from the actor's `reset` flags exactly as the serial sampler does.

Shutdown: `close()` (also on any exception or Ctrl-C in the learner) sets a stop flag,
joins every actor with a timeout and kills stragglers. Actors ignore SIGINT and SIGTERM
(the learner checkpoints and stops them), check the stop flag and their parent at every wait,
and exit when the learner is gone. An actor that dies makes the learner's next wait raise `ActorError`
with one line naming the actor and its exit code.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from multiprocessing.connection import wait as wait_connections
from typing import Callable

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from fnrl import rng
from fnrl.run.stop import leave_signals_to_parent
from fnrl.samplers.lane import STEP_KEYS

STEP_DTYPES = {"reward": torch.float32, "terminated": torch.bool, "truncated": torch.bool, "done": torch.bool,
               "valid": torch.bool, "episode_end": torch.bool, "episode_return": torch.float32,
               "episode_length": torch.float32}
"""The fields of an env step in a trajectory (`fnrl.samplers.lane.STEP_KEYS`), with their dtypes."""
_POLL_S = 0.2  # the longest any wait blocks before checking the stop flag / liveness


class StopFlag:
    """A stop flag shared with child processes: one shared byte, read and written without a lock
    (a `multiprocessing.Event` guards its flag with a lock: an actor killed while it held that
    lock would leave every later `set` / `is_set` waiting for it forever)."""

    def __init__(self, ctx):
        self._flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


class ActorError(RuntimeError):
    """An actor process died, or the inference server failed."""


class _DeadActor(Exception):
    def __init__(self, index: int):
        super().__init__(f"actor {index} closed its pipe")
        self.index = index


def _shared(shape, dtype) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype).share_memory_()


class CentralSampler:
    """Actor processes stepping EnvPool, batched central inference, a bounded trajectory queue.

    env_id, num_envs: each of the `num_actors` actors steps its own `num_envs` envs; env j
        of actor i is seeded `fnrl.rng.env_seeds(seed, num_actors * num_envs)[i * num_envs + j]`,
        so every env has its own seed. env_kwargs: keyword arguments of the env's constructor
        (`fnrl.envs.make`).
    act(state, obs [N, *obs], carry, explore) -> (action [N, ...], extras, carry): the
        policy (fnrl's agent protocol); called only in the inference thread, under no_grad.
        It must not share network modules with code running in another thread (the
        learner's update): `functional_call` swaps a module's parameters while it runs.
    state: the initial state `act` reads; `set_state` swaps it (and its version) later.
    horizon: T, env steps per trajectory.
    num_slots: trajectories in flight (being filled or waiting in the queue) at most; at
        least `num_actors`.
    batch_wait_s: after the first request, how long the server waits for the other actors'
        requests before running the forward anyway.
    obs_shape / obs_dtype: one observation (a tensor observation space).
    stall_timeout_s: `get` raises `ActorError` when no trajectory arrives for this long.
    start_method: "fork" (the default on a CPU device where available: actors start in a
        fraction of a second and inherit the learner's imports; they are started before the
        inference thread) or "spawn" (a fresh interpreter per actor; the default with a
        CUDA device, which must not be forked).

    Counters: `forwards` (inference forward passes), `requests` (actor requests served),
    `batch_sizes` (requests served by each forward, the last 10,000).
    """

    def __init__(self, env_id: str, num_envs: int, num_actors: int, act: Callable, state, *, horizon: int,
                 obs_shape: tuple, obs_dtype: torch.dtype, seed: int = 0, num_slots: int | None = None,
                 batch_wait_s: float = 0.002, device: str | torch.device = "cpu", explore: bool = True,
                 stall_timeout_s: float = 120.0, start_timeout_s: float = 300.0, start_method: str | None = None,
                 env_kwargs: dict | None = None):
        self.env_id, self.num_envs, self.num_actors, self.horizon = env_id, num_envs, num_actors, horizon
        self.env_kwargs = dict(env_kwargs or {})
        self.seed = seed
        self._seeds = rng.env_seeds(seed, num_actors * num_envs)
        self.device = torch.device(device)
        self.batch_wait_s, self.stall_timeout_s, self.start_timeout_s = batch_wait_s, stall_timeout_s, start_timeout_s
        self.num_slots = max(num_slots or 2 * num_actors, num_actors)
        forkable = "fork" in mp.get_all_start_methods() and self.device.type == "cpu"
        self.start_method = start_method or ("fork" if forkable else "spawn")
        self.inference = BatchedInference(act, state, num_actors, num_envs, obs_shape, obs_dtype, self.device, explore)
        self.trajectories = 0
        self._error: BaseException | None = None
        self._started = False
        self._closed = False
        self._procs: list = []
        self._thread: threading.Thread | None = None
        A, B, T = num_actors, num_envs, horizon
        reply = self.inference.example
        self._request = {"obs": _shared((A, B, *obs_shape), obs_dtype), "reset": _shared((A, B), torch.bool)}
        self._reply = {k: _shared((A, *v.shape), v.dtype) for k, v in reply.items()}
        self._reply["version"] = _shared((A,), torch.int64)
        self._slots = {k: _shared((self.num_slots, *v.shape), v.dtype)
                       for k, v in trajectory_buffers(T, B, obs_shape, obs_dtype, reply).items()}

    forwards = property(lambda self: self.inference.forwards, doc="inference forward passes so far")
    requests = property(lambda self: self.inference.requests, doc="actor requests served so far")
    batch_sizes = property(lambda self: self.inference.batch_sizes, doc="requests per forward (the last 10,000)")

    def columns(self) -> dict:
        """Extra columns of a log row (none: the actors are this machine's processes)."""
        return {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "CentralSampler":
        """Spawn the actors and start the inference thread."""
        ctx = mp.get_context(self.start_method)
        self._stop = StopFlag(ctx)
        self._free, self._full = ctx.Queue(), ctx.Queue()
        for s in range(self.num_slots):
            self._free.put(s)
        self._conns = []
        try:
            for i in range(self.num_actors):
                here, there = ctx.Pipe(duplex=True)
                p = ctx.Process(target=_actor_main, name=f"fnrl-actor-{i}", daemon=True, args=(
                    i, self.env_id, self.env_kwargs, self.num_envs,
                    self._seeds[i * self.num_envs:(i + 1) * self.num_envs], self.horizon, self._request, self._reply, self._slots, there, self._free, self._full, self._stop, os.getpid()))
                p.start()
                there.close()
                self._procs.append(p)
                self._conns.append(here)
        except BaseException:
            self.close()
            raise
        self._started = True
        self._thread = threading.Thread(target=self._serve, name="fnrl-inference", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop the inference thread and every actor (join with a timeout, then kill). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_stop"):
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(5.0)
        for c in getattr(self, "_conns", []):
            c.close()
        for q in (getattr(self, "_free", None), getattr(self, "_full", None)):
            if q is not None:
                q.cancel_join_thread()
                q.close()

    def __enter__(self):
        return self.start() if not self._started else self

    def __exit__(self, *exc):
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # ------------------------------------------------------------------ learner side

    def set_state(self, state, version: int) -> None:
        """Serve `state` (policy version `version`) from the next forward on. `state` must
        not be written in place afterwards (fnrl updates return new tensors)."""
        self.inference.set_state(state, version)

    def get(self, n: int) -> TensorDict:
        """Pop `n` trajectories and return them concatenated along B: a TensorDict [T, n * num_envs].

        Raises ActorError if an actor or the inference thread died, or nothing arrived
        for `stall_timeout_s` (the first one gets `start_timeout_s`, to cover process start).
        """
        limit = self.start_timeout_s if self.trajectories == 0 else self.stall_timeout_s
        ids = pop(self._full, n, self.check, limit, self.stall_timeout_s, f"the {self.num_actors} actors")
        batch = trajectory_batch([{k: v[i] for k, v in self._slots.items()} for i in ids], self.device)
        for i in ids:
            self._free.put(i)
        self.trajectories += n
        return batch

    def check(self) -> None:
        """Raise ActorError (one line) if the inference thread failed or an actor died."""
        dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
        if isinstance(self._error, _DeadActor):
            dead = [self._error.index]
        elif self._error is not None:  # the others stopped because of it
            raise ActorError(f"central inference failed: {type(self._error).__name__}: {self._error}; "
                             f"all actors were stopped") from self._error
        if dead:
            p = self._procs[dead[0]]
            raise ActorError(f"actor {dead[0]} (pid {p.pid}) died with exit code {p.exitcode}; "
                             f"all actors were stopped")

    # ------------------------------------------------------------------ inference thread

    def _serve(self) -> None:
        try:
            with torch.no_grad():
                self._serve_loop()
        except BaseException as e:  # reported by check() in the learner thread
            if not self._stop.is_set():
                self._error = e
                self._stop.set()

    def _serve_loop(self) -> None:
        conns = self._conns
        index = {c: i for i, c in enumerate(conns)}
        A = self.num_actors
        while not self._stop.is_set():
            ready = wait_connections(conns, timeout=_POLL_S)
            if not ready:
                continue
            pending = set(ready)
            deadline = time.monotonic() + self.batch_wait_s
            while len(pending) < A and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                more = wait_connections([c for c in conns if c not in pending], timeout=min(left, _POLL_S))
                pending.update(more)
            ids = sorted(index[c] for c in pending)
            for i in ids:
                try:
                    conns[i].recv_bytes()
                except (EOFError, OSError):
                    if self._stop.is_set():
                        return
                    self._procs[i].join(2.0)  # let check() report it with its exit code
                    raise _DeadActor(i) from None
            self._forward(ids)
            for i in ids:
                conns[i].send_bytes(b"a")

    def _forward(self, ids: list[int]) -> None:
        idx = torch.tensor(ids)
        reply, version = self.inference(ids, self._request["obs"].index_select(0, idx).flatten(0, 1),
                                        self._request["reset"].index_select(0, idx).flatten())
        B = self.num_envs
        for j, i in enumerate(ids):
            for k, v in reply.items():
                self._reply[k][i].copy_(v[j * B:(j + 1) * B])
            self._reply["version"][i] = version


class BatchedInference:
    """One `act` forward over the requests of several actors of `num_envs` envs each, with the
    newest state `set_state` gave; the recurrent carry of every actor's envs lives here.

    act(state, obs [N, *obs], carry, explore) -> (action [N, ...], extras, carry): the policy.
    `example`: one actor's reply, {name: CPU tensor [num_envs, ...]} (the action and every extra
    of `act`, nested keys joined by '.'), from one probe forward. Counters: `forwards`,
    `requests` (actor requests served), `batch_sizes` (requests per forward, the last 10,000).
    """

    def __init__(self, act: Callable, state, num_actors: int, num_envs: int, obs_shape: tuple,
                 obs_dtype: torch.dtype, device: torch.device, explore: bool = True):
        self.act, self.num_envs, self.device, self.explore = act, num_envs, device, explore
        self._state, self._version = state, 0
        self._lock = threading.Lock()
        self.forwards = self.requests = 0
        self.batch_sizes: list[int] = []
        obs0 = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype, device=device)
        with torch.no_grad():
            action, extras, carry = act(state, obs0, None, explore)
        self.example = _flat_reply(action, extras, num_envs)
        self.recurrent = carry is not None
        self._carries = [torch.zeros_like(carry) for _ in range(num_actors)] if self.recurrent else None

    def set_state(self, state, version: int) -> None:
        """Act with `state` (policy version `version`) from the next forward on."""
        with self._lock:
            self._state, self._version = state, version

    def __call__(self, ids: list[int], obs: torch.Tensor, reset: torch.Tensor) -> tuple[dict, int]:
        """Act for actors `ids` (in order): obs [n * num_envs, *obs], reset [n * num_envs] (True where
        an observation starts an episode). Returns (the reply {name: CPU tensor [n * num_envs, ...]},
        the policy version that chose it)."""
        B, n = self.num_envs, len(ids)
        obs = obs.to(self.device, non_blocking=True)
        carry = None
        if self.recurrent:
            carry = torch.cat([self._carries[i] for i in ids])
            carry["reset"] = reset.to(self.device)
        with self._lock:
            state, version = self._state, self._version
        with torch.no_grad():
            action, extras, carry = self.act(state, obs, carry, self.explore)
        if self.recurrent:
            for j, i in enumerate(ids):
                self._carries[i] = carry[j * B:(j + 1) * B]
        self.forwards += 1
        self.requests += n
        self.batch_sizes.append(n)
        if len(self.batch_sizes) > 10_000:
            del self.batch_sizes[:5_000]
        return _flat_reply(action, extras, n * B), version


def _flat_reply(action, extras, N: int) -> dict:
    """action + extras as one flat dict of CPU tensors [N, ...] (nested keys joined by '.')."""
    td = TensorDict({"action": action, **dict(extras)}, batch_size=[N])
    return {k: v.detach().cpu() for k, v in td.flatten_keys(".").items()}


def pop(full: queue.Queue, n: int, check: Callable, limit: float, stall_timeout_s: float, who: str) -> list:
    """`n` items from `full`, calling `check()` (which raises on a failure) between tries; an
    ActorError (one line naming `who`) when nothing arrives for `limit` s, or for
    `stall_timeout_s` after an arrival."""
    out, deadline = [], time.monotonic() + limit
    while len(out) < n:
        check()
        try:
            out.append(full.get(timeout=_POLL_S))
            deadline = time.monotonic() + stall_timeout_s
        except queue.Empty:
            if time.monotonic() > deadline:
                raise ActorError(f"no trajectory from {who} for {limit:.0f} s; they or the inference thread are "
                                 f"stuck") from None
    return out


def trajectory_buffers(T: int, B: int, obs_shape: tuple, obs_dtype: torch.dtype, reply: dict) -> dict:
    """Zeroed buffers of one [T, B] trajectory: `obs` [T + 1, B, *obs], the step fields, `reset`,
    the reply's fields ([T, *reply's shape]) and `version` [T, B]."""
    out = {"obs": torch.zeros((T + 1, B, *obs_shape), dtype=obs_dtype)}
    out.update({k: torch.zeros((T, B), dtype=d) for k, d in STEP_DTYPES.items()})
    out["reset"] = torch.zeros((T, B), dtype=torch.bool)
    out.update({k: torch.zeros((T, *v.shape), dtype=v.dtype) for k, v in reply.items()})
    out["version"] = torch.zeros((T, B), dtype=torch.int64)
    return out


def trajectory_batch(trajectories: list[dict], device) -> TensorDict:
    """Trajectories (`trajectory_buffers`' layout) concatenated along B, `obs` split into `obs` and
    `next_obs` (views of one [T + 1, n * B] buffer): a TensorDict [T, n * B] on `device`."""
    batch = {k: torch.cat([t[k] for t in trajectories], dim=1) for k in trajectories[0]}
    obs_all = batch.pop("obs")
    batch.update(obs=obs_all[:-1], next_obs=obs_all[1:])
    return TensorDict(batch, batch_size=obs_all[1:].shape[:2]).unflatten_keys(".").to(device)


# ---------------------------------------------------------------------- actor process


def _actor_main(index, env_id, env_kwargs, num_envs, seeds, horizon, request, reply, slots, conn, free, full, stop,
                parent_pid) -> None:
    leave_signals_to_parent()   # Ctrl-C / SIGTERM: the learner stops this process after its checkpoint
    torch.set_num_threads(1)
    try:
        _actor_loop(index, env_id, env_kwargs, num_envs, seeds, horizon, request, reply, slots, conn, free, full, stop,
                    parent_pid)
    except _Stopped:
        pass
    except BaseException:
        if not stop.is_set():
            traceback.print_exc()
            raise SystemExit(1)
    finally:
        conn.close()
        full.cancel_join_thread()
        free.cancel_join_thread()


class _Stopped(Exception):
    pass


def _alive(stop, parent_pid) -> None:
    if stop.is_set() or os.getppid() != parent_pid:
        raise _Stopped


def _actor_loop(index, env_id, env_kwargs, num_envs, seeds, horizon, request, reply, slots, conn, free, full, stop,
                parent_pid) -> None:
    from fnrl import envs

    env = envs.make(env_id, num_envs, seed=seeds, **env_kwargs)
    env.poll = False   # the actors share the cores with the learner: EnvPool's recv sleeps at once
    try:
        obs = env.reset()["obs"]
        reset = torch.ones(num_envs, dtype=torch.bool)
        my_obs, my_reset = request["obs"][index], request["reset"][index]
        reply_keys = [k for k in reply if k != "version"]
        my_reply = {k: reply[k][index] for k in reply_keys}
        while True:
            slot = None
            while slot is None:
                _alive(stop, parent_pid)
                try:
                    slot = free.get(timeout=_POLL_S)
                except queue.Empty:
                    pass
            out = {k: v[slot] for k, v in slots.items()}
            out["obs"][0] = obs
            for t in range(horizon):
                my_obs.copy_(obs)
                my_reset.copy_(reset)
                conn.send_bytes(b"r")
                while not conn.poll(_POLL_S):
                    _alive(stop, parent_pid)
                conn.recv_bytes()
                for k in reply_keys:
                    out[k][t] = my_reply[k]
                out["version"][t] = reply["version"][index]
                out["reset"][t] = reset
                step = env.step(my_reply["action"])
                for k in STEP_KEYS:
                    out[k][t] = step[k]
                obs = step["obs"]
                out["obs"][t + 1] = obs
                reset = ~step["valid"]
            full.put(slot)
    finally:
        env.close()
