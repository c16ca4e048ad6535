"""What a training run returns."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class TrainResult:
    """What `fnrl.train.train` returns.

    state: the final training state (rows stacked for a vmapped run).
    return_mean: the trailing mean return (last 100 finished episodes; the mean over rows).
    history: the rows written to progress.csv.
    log_dir: the run folder (None on ranks other than 0).
    eval_returns: the final deterministic evaluation's episode returns, one list per row
        (None where evaluation was off or another process evaluated).
    """

    state: object
    return_mean: float
    history: list
    log_dir: Path
    eval_returns: list | None = None

    @property
    def eval_return_mean(self) -> float:
        """The final evaluation's mean return (the mean of the rows' means; NaN without one)."""
        if not self.eval_returns:
            return math.nan
        return float(np.mean([np.mean(r) for r in self.eval_returns]))


def mean_of_rows(values: list[float]) -> float:
    """The mean of the rows' values that are defined (NaN if none is)."""
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else math.nan
