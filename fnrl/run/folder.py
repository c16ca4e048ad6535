"""The run folder: where a run writes progress.csv, config.json, TensorBoard events and its checkpoint.

A run holds its folder while it trains: `LOCK` names its host and process, so a second run
started on the same folder (another shell, a relaunched grid) stops with one line instead of
writing over the first. A lock whose process has ended (killed, crashed) is taken over.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from datetime import datetime
from pathlib import Path

from fnrl.errors import ConfigError
from fnrl.files import replacing
from fnrl.run.checkpoint import CHECKPOINT


def default_run_dir(name: str, config, seed: int) -> Path:
    """`runs/ALGO-ENV-sSEED-DATE-TIME`."""
    env = config.env_id.replace("/", "_").replace(":", "_")
    return Path("runs") / f"{name}-{env}-s{seed}-{datetime.now():%Y%m%d-%H%M%S}"


LOCK = "run.lock"
"""The file a training run holds in its folder ("HOST PID")."""


def prepare_run_dir(log_dir, name: str, config, seed: int, resume: bool, claim: bool = True) -> Path:
    """The run folder, created and (`claim`) held by this process (`claim_run_dir`): `log_dir`
    (default: `default_run_dir`); ConfigError if its parent is missing, if it already holds a run
    that is not being resumed, or if another run holds it."""
    path = Path(log_dir) if log_dir is not None else default_run_dir(name, config, seed)
    if log_dir is not None:
        check_log_dir(path)
    if not resume and (path / CHECKPOINT).exists():
        raise ConfigError(f"{path} already holds a run; use --resume {path} to continue it or pick a new --log-dir")
    path.mkdir(parents=True, exist_ok=True)
    if claim:
        claim_run_dir(path)
    return path


def check_log_dir(log_dir) -> None:
    """ConfigError, before any work, if `--log-dir` cannot hold this run: its parent is missing, it
    is a file, or another live run holds it."""
    path = Path(log_dir)
    if not path.resolve().parent.is_dir():
        raise ConfigError(f"log dir parent {path.resolve().parent} does not exist; create it or choose another "
                          "--log-dir")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--log-dir {log_dir} is a file, not a folder; choose another --log-dir")
    check_free(path)


def _me() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


def holder(path) -> str | None:
    """The live "HOST PID" of the run holding folder `path`, or None (no lock, this process's, or a
    process gone)."""
    lock = Path(path) / LOCK
    try:
        text = lock.read_text().strip()
    except FileNotFoundError:
        return None
    host, _, pid = text.rpartition(" ")
    if text == _me() or not pid.isdigit():
        return None
    if host != socket.gethostname():
        return text   # another machine's run: it cannot be checked from here
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return text


def check_free(path) -> None:
    """ConfigError naming the run that holds folder `path`, if another one does."""
    running = holder(path)
    if running is not None:
        raise ConfigError(f"{path} is in use by another run (process {running}); wait for it to end or pick "
                          f"another --log-dir (delete {Path(path) / LOCK} if no run uses the folder)")


def claim_run_dir(path: Path) -> None:
    """Hold run folder `path` for this process: ConfigError naming the run that holds it, if one does."""
    check_free(path)
    lock = Path(path) / LOCK
    with replacing(lock) as tmp:
        tmp.write_text(_me() + "\n")


def release_run_dir(path) -> None:
    """Let go of run folder `path` if this process holds it."""
    if path is None:
        return
    lock = Path(path) / LOCK
    try:
        if lock.read_text().strip() == _me():
            lock.unlink()
    except FileNotFoundError:
        pass


def write_config_json(run_dir: Path, name: str, seed: int, config, preset: str | None, **extra) -> None:
    """The run's `config.json`: algorithm, seed, the preset its config started from (None for the
    defaults), the config, and the loop's own entries (`extra`)."""
    (run_dir / "config.json").write_text(json.dumps(
        {"algo": name, "seed": seed, "preset": preset, **extra, "config": dataclasses.asdict(config)}, indent=2,
        default=str))
