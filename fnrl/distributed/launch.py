"""`train(..., nproc=N)` / `fnrl train ... --nproc N`: N data-parallel processes on this machine.

The parent checks everything a run could refuse (algorithm, options, env id, action space,
log dir, checkpoint) and prints the usual one-line error before any process starts. It
then runs torchrun's elastic agent in-process (`torch.distributed.launcher.elastic_launch`,
the same machinery as `torchrun --standalone --nproc_per_node N`, with a free local port):
N spawned workers, each calling `fnrl.train.train` as one rank. The agent stops all
workers when one fails or when the parent is interrupted (Ctrl-C, SIGTERM); each worker
also asks the kernel for SIGTERM if the parent dies (Linux), so none is orphaned.

Errors a run raises on purpose (ConfigError, TrainingError after a NaN) happen on every
rank at once (fnrl.train agrees on them) and come back to the parent as the same
exception with rank 0's message; anything else fails the launch with the rank's error.
"""
from __future__ import annotations

import os
import uuid

import torch.distributed as dist

from fnrl.errors import ConfigError
from fnrl.run.health import TrainingError


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
    env = envs.make(run_config.env_id, 1, seed=seed)
    try:
        module.validate(run_config, env.spec)
    finally:
        env.close()
    if resume is None:   # resolve the default folder name here, so rank 0 uses this one
        log_dir = prepare_run_dir(log_dir, name, run_config, seed, False)
    return config, log_dir


def train_processes(train, nproc: int, name: str, config=None, **kwargs):
    """Run `train(name, config, **kwargs)` (`fnrl.train.train`, passed in: each worker imports it by
    name) as `nproc` data-parallel ranks on this machine; return rank 0's TrainResult."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not isinstance(nproc, int) or nproc < 1:
        raise ConfigError(f"--nproc must be a positive integer, got {nproc}")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or (dist.is_available() and dist.is_initialized()):
        raise ConfigError("--nproc starts its own processes; under torchrun leave it out "
                          "(torchrun's --nproc_per_node sets the number of processes)")
    config, kwargs["log_dir"] = _preflight(name, config, kwargs.get("log_dir"), kwargs.get("resume"),
                                           kwargs.get("device", "cpu"), kwargs.get("seed", 0), nproc)
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"fnrl-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5,
                          start_method="spawn")
    try:
        results = elastic_launch(launch, _rank_train)(train, name, config, kwargs)
    except ChildFailedError as e:
        rank, failure = min(e.failures.items())
        raise RuntimeError(f"rank {rank} of the {nproc}-process run failed (exit code {failure.exitcode}); "
                           f"see its error above") from None
    kind, payload = results[0]
    if kind == "ok":
        return payload
    raise (ConfigError if kind == "config" else TrainingError)(payload)


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


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent (the launcher) dies, even by SIGKILL."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
