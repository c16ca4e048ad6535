"""Learning test of vmapped seeds: every seed of one `--num-seeds 8` run solves CartPole."""
import math

import pytest

from fnrl.algos import ppo
from fnrl.train import train


@pytest.mark.slow
def test_ppo_eight_vmapped_seeds_all_solve_cartpole(tmp_path):
    """`fnrl train ppo --num-seeds 8 --total-steps 100000`: every seed reaches a return_mean >= 475
    within 100k env steps of its own (the run stops once all have)."""
    result = train("ppo", ppo.Config(env_id="CartPole-v1", total_steps=100_000), seed=1, num_seeds=8,
                   log_dir=tmp_path / "run", quiet=True, tensorboard=False, plot=False, stop_return=475)
    best = {}
    for row in result.history:
        if not math.isnan(row["return_mean"]):
            best[row["seed"]] = max(best.get(row["seed"], 0.0), row["return_mean"])
    assert sorted(best) == list(range(1, 9))
    assert result.history[-1]["env_steps"] <= 100_352
    assert all(v >= 475 for v in best.values()), best
