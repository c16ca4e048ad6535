"""What the learning tests share: the final evaluation of every seed and the rules they judge it by."""
from __future__ import annotations

import numpy as np


def final_evaluations(result) -> list[float]:
    """Each seed's mean return in the run's final evaluation (no exploration, separate envs)."""
    assert result.eval_returns is not None, "the run made no final evaluation"
    return [float(np.mean(r)) for r in result.eval_returns]


def assert_most_seeds_reach(result, threshold: float, floor: float, misses: int = 1) -> None:
    """The rule: at most `misses` seeds end below `threshold`, and none below `floor`."""
    evals = final_evaluations(result)
    below = [e for e in evals if e < threshold]
    assert len(below) <= misses and min(evals) >= floor, \
        f"final evaluations {[round(e, 1) for e in evals]}: {len(below)} below {threshold} (at most {misses}), " \
        f"worst {min(evals):.1f} (floor {floor})"


def assert_stopped_early(result, budget: int) -> None:
    """A run with a stop rule stopped before its budget."""
    assert result.history[-1]["env_steps"] < budget, f"ran its whole budget of {budget} env steps"
