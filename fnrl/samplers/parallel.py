"""The parallel sampler: worker processes, each with its own EnvPool and a CPU copy of
the policy reading parameters from shared memory (rlpyt's CpuSampler).

    learner                              worker w (of W), envs [w B/W, (w+1) B/W)
    -------                              --------------------------------------
    shared_state <- state (copy)
    send "collect" to every worker  -->  T x (act on its envs, step its EnvPool,
                                              write its columns of the shared rollout)
    wait for every "done"           <--  send "done"
    rollout (shared [T, B], or a copy on --device)

Workers are started once, by "forkserver" by default: a single-threaded server process
imports torch, EnvPool and fnrl once and forks every worker from itself ("spawn" re-imports
torch in every worker, 10-30 s each on a busy machine; plain "fork" of a learner that has
run EnvPool and torch threads crashed a worker here, exit code -11). Workers
rebuild `act` from `agent=(algo name, config)` through
`fnrl.algos.load(name).make(config, spec)` (or unpickle a picklable `act`), and keep their
envs, last observations and recurrent carries between collects. Worker w's envs are
built with the seeds they have in one pool of B (`env.factory`), so a deterministic
policy gives exactly the serial sampler's rollout.

Shutdown: `close()` (also run at interpreter exit and when the sampler is garbage
collected) asks each worker to stop, then kills what remains. Workers are daemons, ignore
SIGINT and SIGTERM (the learner checkpoints and stops them; their forkserver starts with both
blocked), and exit when the learner dies (their pipe closes or the learner's pid is gone).
Every wait has a timeout; a worker that dies or fails makes `collect` raise `SamplerError` at
once, naming the worker, and closes the sampler.
"""
from __future__ import annotations

import os
import time
import traceback
import weakref
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Callable

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from fnrl.envs.batched import BatchedEnv
from fnrl.errors import ConfigError, SamplerError
from fnrl.run.stop import leave_signals_to_parent, signals_blocked
from fnrl.samplers.lane import Lane, RolloutBuffer


def default_workers(num_envs: int) -> int:
    """The largest divisor of num_envs that is at most os.cpu_count()."""
    cpus = os.cpu_count() or 1
    return max(w for w in range(1, min(cpus, num_envs) + 1) if num_envs % w == 0)


class ParallelSampler:
    """Collect [T, B] rollouts with W worker processes of B/W envs each.

    env: the B-env batch to mirror (from fnrl.envs.make); it is stepped once in this
        process to learn the rollout's layout, then closed.
    act: the policy (used in this process for that one step, and sent to the workers when
        `agent` is None: then it must be picklable).
    agent: (algo name, config): workers rebuild `act` from it (needed for compiled acts).
    workers: W, a divisor of B (default: `default_workers(B)`).
    timeout: seconds a collect may take before the sampler gives up; start_timeout: the same
        for the workers' start. start_method: "forkserver" (default), "spawn" or "fork".
    Options that only the learner's `state` carries: workers read every entry of `state`
    except "opt_state", copied into shared memory before each collect.
    """

    def __init__(self, env: BatchedEnv, act: Callable, horizon: int, device: str | torch.device = "cpu", *,
                 agent: tuple | None = None, workers: int | None = None, timeout: float = 300.0,
                 start_timeout: float = 120.0, start_method: str = "forkserver"):
        B = env.num_envs
        W = default_workers(B) if workers is None else workers
        if W < 1 or B % W:
            raise ConfigError(f"--sampler-workers {W} must be at least 1 and divide --num-envs {B}")
        if start_method not in mp.get_all_start_methods():
            raise ConfigError(f"start method {start_method!r} is not available here; use one of "
                              f"{', '.join(mp.get_all_start_methods())}")
        if env.factory is None:
            raise ConfigError("the parallel sampler needs an env built by fnrl.envs.make (it rebuilds it in workers)")
        self.env, self.act, self.horizon, self.device = env, act, horizon, torch.device(device)
        self.spec, self.num_envs, self.workers, self.timeout = env.spec, B, W, timeout
        self.buffer: RolloutBuffer | None = None
        self._out: RolloutBuffer | None = None
        self._shared_state = None
        policy = ("agent", agent) if agent is not None else ("act", act)
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":   # the server imports these once; each worker is a fork of it
            ctx.set_forkserver_preload(["torch", "envpool", "fnrl.algos", "fnrl.envs", "fnrl.samplers.parallel"])
            with signals_blocked():   # the workers' parent must outlive a SIGTERM to the process group
                forkserver.ensure_running()
        n, base_seed = B // W, int(torch.randint(2**31 - 1, ()))
        self._conns, self._procs = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
        try:
            for w in range(W):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, name=f"fnrl-sampler-{w}", daemon=True,
                                   args=(child, env.factory, n, env.seeds[w * n:(w + 1) * n], slice(w * n, (w + 1) * n),
                                         policy, env.spec, horizon, base_seed + w, os.getpid()))
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            self._wait_all("start", start_timeout)
        except BaseException:
            self.close()
            raise

    # ----- learner side -----------------------------------------------------------------------
    def _first(self, state, explore: bool) -> None:
        """Lay out the shared rollout from one step of `env` here; hand it to the workers."""
        env = self.env
        obs = env.reset()["obs"].to(self.device)
        action, extras, carry = self.act(state, obs, None, explore)
        step = env.step(action)
        env.close()
        self.buffer = RolloutBuffer(self.horizon, self.num_envs, obs.cpu(), action.cpu(),
                                    {k: v.cpu() for k, v in extras.items()}, step, carry is not None, share=True)
        if state is not None:
            self._shared_state = _learner_view(state).to("cpu").clone().share_memory_()
        if self.device.type != "cpu":
            self._out = self.buffer.clone(self.device)
        self._send_all(("bind", self.buffer, self._shared_state))
        self._wait_all("bind", self.timeout)

    @torch.no_grad()
    def collect(self, state, explore: bool = True) -> TensorDict:
        """Every worker steps its envs `horizon` times; return the rollout TensorDict [T, B]."""
        if self.buffer is None:
            self._first(state, explore)
        elif state is not None:
            self._shared_state.update_(_learner_view(state))
        self._send_all(("collect", explore))
        self._wait_all("collect", self.timeout)
        if self._out is None:
            return self.buffer.rollout
        self._out.copy_(self.buffer)
        return self._out.rollout

    @property
    def rollout(self) -> TensorDict | None:
        out = self._out or self.buffer
        return None if out is None else out.rollout

    def _send_all(self, msg) -> None:
        for w, conn in enumerate(self._conns):
            try:
                conn.send(msg)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._fail(w, "died")

    def _wait_all(self, what: str, timeout: float) -> None:
        """Wait for every worker's answer to `what`: at most `timeout` s, failing at once if one dies."""
        pending = set(range(len(self._procs)))
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                ws = sorted(pending)
                self.close()
                raise SamplerError(f"parallel sampler: worker(s) {ws} gave no answer to {what!r} within {timeout:.0f} s; "
                                   f"the sampler is closed (raise its timeout if collects are really this slow)")
            ready = wait([self._conns[w] for w in pending] + [self._procs[w].sentinel for w in pending],
                         timeout=min(left, 1.0))
            for w in sorted(pending):
                conn, proc = self._conns[w], self._procs[w]
                if conn in ready or conn.poll(0):
                    try:
                        msg = conn.recv()
                    except (EOFError, OSError):
                        self._fail(w, f"died during {what!r}")
                    if msg[0] == "error":
                        self._fail(w, f"failed during {what!r}:\n{msg[1]}")
                    pending.discard(w)
                elif proc.sentinel in ready:
                    self._fail(w, f"died during {what!r}")

    def _fail(self, w: int, why: str):
        proc = self._procs[w]
        proc.join(0.5)
        code = proc.exitcode
        self.close()
        raise SamplerError(f"parallel sampler worker {w} (pid {proc.pid}, exit code {code}) {why}; "
                           f"the sampler is closed")

    def close(self) -> None:
        """Stop every worker (idempotent): ask, then terminate, then kill; join each with a timeout."""
        self._finalizer()
        if self.buffer is None and self.env is not None:
            self.env.close()


def _learner_view(state: TensorDict) -> TensorDict:
    """What acting may read: the state without the optimizer's."""
    return state.exclude("opt_state") if "opt_state" in state.keys() else state


def _shutdown(procs, conns) -> None:
    for conn in conns:
        try:
            conn.send(("close",))
        except Exception:
            pass
    for proc in procs:
        proc.join(2.0)
    for proc in procs:   # a worker ignores SIGTERM: one still running is killed
        if proc.is_alive():
            proc.kill()
            proc.join(2.0)
    for conn in conns:
        conn.close()


# ----- worker side ----------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _worker(conn, factory, num_envs, seeds, columns, policy, spec, horizon, torch_seed, learner_pid) -> None:
    leave_signals_to_parent()   # Ctrl-C / SIGTERM: the learner stops this process after its checkpoint
    torch.set_num_threads(1)
    torch.manual_seed(torch_seed)
    env = None
    try:
        env = factory(num_envs, seeds)
        env.poll = False   # the workers and the learner share the cores: EnvPool's recv sleeps at once
        kind, value = policy
        if kind == "agent":
            from fnrl import algos

            name, config = value
            act = algos.load(name).make(config, spec).act
        else:
            act = value
        conn.send(("ok",))
        lane = state = None
        while True:
            if not conn.poll(1.0):
                if not _alive(learner_pid):
                    return
                continue
            msg = conn.recv()
            if msg[0] == "close":
                return
            if msg[0] == "bind":
                buffer, state = msg[1], msg[2]
                lane = Lane(env, act, columns)
                lane.bind(buffer)
                conn.send(("ok",))
            elif msg[0] == "collect":
                explore = msg[1]
                with torch.no_grad():
                    lane.begin()
                    for t in range(horizon):
                        lane.record(t, env.step_arrays(lane.act(state, explore)))
                conn.send(("ok",))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
    finally:
        if env is not None:
            env.close()
