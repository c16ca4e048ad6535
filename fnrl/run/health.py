"""A run that cannot go on stops with one `TrainingError` line, its last good checkpoint intact:
when a loss stops being finite (the NaN checks), or when its sampler, a worker or an actor fails
(`stopped_by`)."""
from __future__ import annotations

import math
from pathlib import Path

import torch


class TrainingError(RuntimeError):
    """Training stopped (a NaN in a loss, a failed sampler); the last good checkpoint is intact."""


def scalar_metrics(metrics) -> dict:
    """The 0-d tensors of `metrics` as floats."""
    return {k: float(v) for k, v in metrics.items() if torch.is_tensor(v) and v.ndim == 0}


def non_finite_losses(scalars: dict, metrics=None) -> dict:
    """name -> value of every loss (a key starting with "loss") that is NaN or infinite: among the
    floats `scalars`, and among the 1-d tensors of `metrics` (one value per vmapped row)."""
    bad = {k: v for k, v in scalars.items() if k.startswith("loss") and not math.isfinite(v)}
    for k, v in (metrics.items() if metrics is not None else ()):
        if k.startswith("loss") and torch.is_tensor(v) and v.ndim == 1 and not torch.isfinite(v).all():
            bad[k] = float(v[~torch.isfinite(v)][0])
    return bad


def raise_if_loss_not_finite(bad: dict, env_steps: int, last_checkpoint) -> None:
    """TrainingError naming the first non-finite loss (`bad`: name -> value), if any."""
    if bad:
        raise TrainingError(f"{', '.join(bad)} became {list(bad.values())[0]} by env step {env_steps}; "
                            f"the last good checkpoint is {last_checkpoint}")


def check_finite(metrics, env_steps: int, last_checkpoint) -> dict:
    """The 0-d metrics as floats; TrainingError if a loss among them is NaN or infinite."""
    scalars = scalar_metrics(metrics)
    raise_if_loss_not_finite(non_finite_losses(scalars), env_steps, last_checkpoint)
    return scalars


def stopped_by(error: Exception, env_steps: int, last_checkpoint) -> TrainingError:
    """The one-line TrainingError of a run whose sampler, worker or actor failed (`error` says
    which), naming the env step and the checkpoint it can resume from, if one was written."""
    kept = (f"the last checkpoint is {last_checkpoint}" if Path(str(last_checkpoint)).exists()
            else "no checkpoint was written yet")
    return TrainingError(f"{error} (at env step {env_steps}); {kept}")
