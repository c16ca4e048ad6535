"""`train(..., nproc=N)` / `fnrl train ... --nproc N`: N data-parallel processes on this machine.

The parent checks everything a run could refuse (algorithm, options, env id, action space,
log dir, checkpoint) and prints the usual one-line error before any process starts. It then
spawns N workers, each calling `fnrl.train.train` as one rank. They meet privately: the process
group's rendezvous is a `FileStore` in a temporary folder only this user can read (mode 0700),
and gloo's connections between the ranks use the loopback interface, so the run listens on no
network interface (torchrun's TCP rendezvous is for multi-node runs, on a trusted network).
Stopping: the workers run in a process group of their own, and the parent forwards the first
SIGINT or SIGTERM it receives (Ctrl-C, a scheduler's stop) to each of them once. The ranks agree
on the stop at the next iteration boundary, rank 0 writes the checkpoint, and the command ends
with the stop's one line (exit code 128 + the signal), as a single-process run does. A rank
notes a repeated stop without acting on it (it may get one from the scheduler and one from
the parent); a second signal to the parent ends the run: the parent then stops its ranks (SIGKILL
after a grace period). The parent stops every worker when one fails; each worker also asks
the kernel for SIGTERM if the parent dies (Linux), so none is orphaned.

Errors a run raises on purpose (ConfigError, TrainingError after a NaN) happen on every
rank at once (fnrl.train agrees on them) and come back to the parent as the same
exception with rank 0's message; anything else fails the launch with the rank's error.
"""
from __future__ import annotations

import os
import pickle
import queue
import signal
import tempfile
import time

import torch.distributed as dist

from fnrl.distributed.data_parallel import STORE_VAR
from fnrl.distributed.wire import LOOPBACK
from fnrl.errors import ConfigError
from fnrl.run.health import TrainingError
from fnrl.run.stop import RunStopped, StopRequest


def _preflight(name: str, config, log_dir, resume, device: str, seed: int, nproc: int):
    """The checks `train` does before work, done once here: returns (config, log_dir) to hand on."""
    from fnrl import algos, envs
    from fnrl.run.checkpoint import load_checkpoint
    from fnrl.run.folder import prepare_run_dir
    from fnrl.run.plan import resumed_config

    module = algos.load(name)
    if resume is not None:
        run_config = resumed_config(load_checkpoint(resume), name, resume, nproc)
    else:
        run_config = config if config is not None else algos.default_config(name)
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was asked for but no CUDA device is available; use --device cpu")
        if torch.cuda.device_count() < nproc:
            raise ConfigError(f"--nproc {nproc} with --device cuda needs {nproc} GPUs; "
                              f"this machine has {torch.cuda.device_count()}")
    module.validate(run_config)
    env = envs.make(run_config.env_id, 1, seed=seed, **run_config.env_kwargs)
    try:
        module.validate(run_config, env.spec)
    finally:
        env.close()
    if resume is None:   # resolve the default folder name here, so rank 0 uses this one
        log_dir = prepare_run_dir(log_dir, name, run_config, seed, False, claim=False)   # rank 0 claims it
    return config, log_dir




def train_processes(train, nproc: int, name: str, config=None, **kwargs):
    """Run `train(name, config, **kwargs)` (`fnrl.train.train`, passed in: each worker imports it by
    name) as `nproc` data-parallel ranks on this machine; return rank 0's TrainResult."""
    import multiprocessing as mp

    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"--nproc must be a positive integer, got {nproc}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (dist.is_available() and dist.is_initialized()):
        raise ConfigError("--nproc starts its own processes; under torchrun leave it out "
                          "(torchrun's --nproc_per_node sets the number of processes)")
    config, kwargs["log_dir"] = _preflight(name, config, kwargs.get("log_dir"), kwargs.get("resume"),
                                           kwargs.get("device", "cpu"), kwargs.get("seed", 0), nproc)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="fnrl-rendezvous-") as private:   # mode 0700
        results = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(rank, nproc, os.path.join(private, "store"), results, train,
                                                      name, config, kwargs), daemon=False) for rank in range(nproc)]
        try:
            with StopRequest() as stop:
                for proc in procs:
                    proc.start()
                kind, payload = _wait(procs, results, stop)
        finally:
            _stop(procs)
            results.close()
    if kind == "ok":
        return payload
    if kind == "stopped":
        raise RunStopped(*payload)
    raise (ConfigError if kind == "config" else TrainingError)(payload)


def _wait(procs, results, stop: StopRequest, poll: float = 0.2):
    """Rank 0's (kind, payload) once every rank has exited cleanly, forwarding a stop signal to
    the ranks once; RuntimeError naming the first rank that failed (the others are then
    stopped), or RunStopped when a rank died of the forwarded signal (before its loop)."""
    outcome, forwarded = None, False
    while True:
        try:
            outcome = results.get(timeout=poll)
        except queue.Empty:
            pass
        if stop.requested and not forwarded:
            forwarded = True
            for proc in procs:
                if proc.is_alive():
                    os.kill(proc.pid, stop.signum)
        failed = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed and forwarded:   # e.g. a rank still starting, not yet in a group of its own
            name = signal.Signals(stop.signum).name
            raise RunStopped(f"stopped by {name}; rank {failed[0][0]} ended before the stop's checkpoint (an "
                             f"earlier checkpoint, if any, is intact)", stop.signum)
        if failed:
            rank, code = failed[0]
            raise RuntimeError(f"rank {rank} of the {len(procs)}-process run failed (exit code {code}); "
                               f"see its error above")
        if all(p.exitcode == 0 for p in procs):
            if outcome is None:   # rank 0 put it just before exiting
                outcome = results.get(timeout=10)
            return pickle.loads(outcome)   # from our own rank 0, over a private pipe


def _stop(procs, grace: float = 10.0) -> None:
    """SIGTERM every worker still running, then SIGKILL those left after `grace` seconds."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _rank_main(rank: int, world_size: int, store: str, results, train, name: str, config, kwargs: dict):
    """A spawned worker: join the private rendezvous as `rank`, train, and (rank 0) hand back the result."""
    os.setpgid(0, 0)   # signals to the command's process group reach the parent only, which forwards them
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), STORE_VAR: store, "GLOO_SOCKET_IFNAME": LOOPBACK})
    outcome = _rank_train(train, name, config, kwargs)
    if rank == 0:   # by value: a tensor sent as a shared handle dies with this process
        results.put(pickle.dumps(outcome))
        results.close()
        results.join_thread()


def _rank_train(train, name: str, config, kwargs: dict):
    """One worker: `train` as one rank. Deliberate errors come back as values (every rank
    has them at once), so the parent re-raises them with one line."""
    _die_with_parent()
    try:
        return "ok", train(name, config, **kwargs)
    except ConfigError as e:
        return "config", str(e)
    except TrainingError as e:
        return "training", str(e)
    except RunStopped as e:   # every rank stopped at the same step; rank 0 wrote the checkpoint
        return "stopped", (str(e), e.signum)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent (the launcher) dies, even by SIGKILL: the ranks
    stop at their next iteration with a checkpoint."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
