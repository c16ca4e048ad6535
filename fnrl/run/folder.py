"""The run folder: where a run writes progress.csv, config.json, TensorBoard events and its checkpoint."""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path

from fnrl.errors import ConfigError
from fnrl.run.checkpoint import CHECKPOINT


def default_run_dir(name: str, config, seed: int) -> Path:
    """`runs/ALGO-ENV-sSEED-DATE-TIME`."""
    env = config.env_id.replace("/", "_")
    return Path("runs") / f"{name}-{env}-s{seed}-{datetime.now():%Y%m%d-%H%M%S}"


def prepare_run_dir(log_dir, name: str, config, seed: int, resume: bool) -> Path:
    """The run folder, created: `log_dir` (default: `default_run_dir`); ConfigError if its parent is
    missing, or if it already holds a run that is not being resumed."""
    path = Path(log_dir) if log_dir is not None else default_run_dir(name, config, seed)
    parent = path.resolve().parent
    if log_dir is not None and not parent.is_dir():
        raise ConfigError(f"log dir parent {parent} does not exist; create it or choose another --log-dir")
    if not resume and (path / CHECKPOINT).exists():
        raise ConfigError(f"{path} already holds a run; use --resume {path} to continue it or pick a new --log-dir")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config_json(run_dir: Path, name: str, seed: int, config, preset: str | None, **extra) -> None:
    """The run's `config.json`: algorithm, seed, the preset its config started from (None for the
    defaults), the config, and the loop's own entries (`extra`)."""
    (run_dir / "config.json").write_text(json.dumps(
        {"algo": name, "seed": seed, "preset": preset, **extra, "config": dataclasses.asdict(config)}, indent=2,
        default=str))
