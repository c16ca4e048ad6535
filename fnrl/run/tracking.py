"""Experiment tracking: a run's progress rows, config and videos also sent to W&B or MLflow.

    fnrl train ppo --track wandb        # WANDB_PROJECT (default "fnrl"), WANDB_MODE=offline, ...
    fnrl train ppo --track mlflow       # MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME (default "fnrl")

Each progress row is logged at its `env_steps` with the same scalars as progress.csv and
TensorBoard (a vmapped run's rows under `seed_<s>/...`, and `<field>_<value>/...` for a swept
field; MLflow names take "." for each "/": `loss.policy`, `seed_1.return_mean`). The Config,
algorithm, seed and preset are the run's config (W&B) or parameters (MLflow); at the end the
curve (curve.png) and the evaluations' videos (`--capture-video`) are logged as well. The tracker's run is named after the
run folder, and its id is kept in `RUN/tracking.json`, so a resumed run (`--resume`) continues
the same tracked run (the rows after its checkpoint, which the resumed run logs again, are logged
once more: W&B keeps the first, MLflow both). Each tracker is an optional extra
(`pip install "fnrl[wandb]"` / `"fnrl[mlflow]"`); where and how it stores runs is its own
configuration (environment variables, login), which fnrl leaves alone.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

from fnrl.errors import ConfigError

TRACKERS = {"wandb": "wandb", "mlflow": "mlflow"}
"""--track choices and the package each one needs."""

STATE = "tracking.json"
"""The tracked run's id, in the run folder (for `--resume`)."""


def check_tracker(kind: str | None) -> None:
    """ConfigError for an unknown tracker or one whose package is not installed (before any work)."""
    if kind is None:
        return
    if kind not in TRACKERS:
        raise ConfigError(f"unknown tracker {kind!r} for --track; use one of: {', '.join(TRACKERS)}")
    if importlib.util.find_spec(TRACKERS[kind]) is None:
        raise ConfigError(f"--track {kind} needs the {TRACKERS[kind]} package: pip install \"fnrl[{kind}]\"")


def open_tracker(kind: str | None, run_dir: Path, name: str, seed: int, config, preset: str | None,
                 resumed: bool = False):
    """The tracker of `kind` (None: no tracking) for the run in `run_dir`: a new tracked run, or,
    for a resumed run whose `tracking.json` names one of this tracker, that run continued."""
    if kind is None:
        return None
    params = {"algo": name, "seed": seed, "preset": preset, **dataclasses.asdict(config)}
    state_path = Path(run_dir) / STATE
    kept = json.loads(state_path.read_text()) if resumed and state_path.exists() else {}
    run_id = kept.get("run_id") if kept.get("tracker") == kind else None
    tracker = {"wandb": WandbTracker, "mlflow": MlflowTracker}[kind](Path(run_dir).name, params, run_id)
    state_path.write_text(json.dumps({"tracker": kind, "run_id": tracker.run_id}))
    return tracker


def scalars(row: dict, run_keys: tuple) -> dict:
    """The row's finite numbers, except env_steps, named as the trackers take them: prefixed
    with the row's `run_keys` (a vmapped run's seed and swept field) as `key_value/`."""
    prefix = "".join(f"{k}_{row[k]}/" for k in run_keys if k in row)
    return {prefix + k: float(v) for k, v in row.items()
            if k != "env_steps" and k not in run_keys and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


class WandbTracker:
    """A W&B run (`wandb.init(project=$WANDB_PROJECT or "fnrl", name=<run folder>)`)."""

    def __init__(self, name: str, params: dict, run_id: str | None):
        import os

        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "fnrl"), name=name, config=params,
                              id=run_id, resume="allow" if run_id else None, reinit="create_new")
        self.run_id = self.run.id

    def log(self, values: dict, step: int) -> None:
        self.run.log(values, step=step)

    def finish(self, run_dir: Path) -> None:
        if (run_dir / "curve.png").exists():
            self.run.log({"curve": self.wandb.Image(str(run_dir / "curve.png"))})
        videos = sorted((run_dir / "videos").glob("*.mp4")) + sorted((run_dir / "videos").glob("*.gif"))
        for video in videos:
            self.run.log({f"videos/{video.stem}": self.wandb.Video(str(video))})
        self.run.finish()


class MlflowTracker:
    """An MLflow run (experiment $MLFLOW_EXPERIMENT_NAME or "fnrl", run name = the run folder's)."""

    def __init__(self, name: str, params: dict, run_id: str | None):
        import os

        import mlflow

        self.mlflow = mlflow
        if run_id is None:
            mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "fnrl"))
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else name)
        self.run_id = self.run.info.run_id
        if run_id is None:
            mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})

    def log(self, values: dict, step: int) -> None:
        # "." for "/": a file store keeps a metric per file, so "loss" and "loss/policy" cannot both be paths
        self.mlflow.log_metrics({k.replace("/", "."): v for k, v in values.items()}, step=step, run_id=self.run_id)

    def finish(self, run_dir: Path) -> None:
        if (run_dir / "curve.png").exists():
            self.mlflow.log_artifact(str(run_dir / "curve.png"), run_id=self.run_id)
        if (run_dir / "videos").is_dir():
            self.mlflow.log_artifacts(str(run_dir / "videos"), artifact_path="videos", run_id=self.run_id)
        self.mlflow.end_run()


def tracker_for(plan, run_dir: Path):
    """`open_tracker` for a plan (`fnrl.run.plan.Plan`: its `track`, name, seed, config and preset)."""
    return open_tracker(plan.track, run_dir, plan.name, plan.seed, plan.run_config, plan.preset,
                        resumed=plan.ckpt is not None)
