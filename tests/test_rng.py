"""fnrl.rng: independent streams spawned from a run's seed."""
import random

import numpy as np
import pytest
import torch

from fnrl import envs, rng
from fnrl.seeds import Row, env_seeds as row_env_seeds


def test_sixty_four_seeds_of_sixty_four_envs_share_no_env_seed():
    seeds = [s for seed in range(64) for s in rng.env_seeds(seed, 64)]
    assert len(seeds) == 4096 and len(set(seeds)) == 4096
    assert all(0 <= s <= rng.MAX_SEED for s in seeds)


def test_env_seeds_are_prefix_stable_and_differ_by_rank_and_stream():
    assert rng.env_seeds(5, 8)[:3] == rng.env_seeds(5, 3)
    ranks = rng.env_seeds(5, 8, rank=0) + rng.env_seeds(5, 8, rank=1)
    assert len(set(ranks)) == 16
    assert not set(rng.env_seeds(5, 8)) & set(rng.env_seeds(5, 8, stream=rng.EVAL_ENV))


def test_streams_are_those_of_numpy_seed_sequence():
    expected = np.random.SeedSequence(7, spawn_key=(rng.INIT,)).generate_state(1)[0] & 0x7FFFFFFF
    assert rng.derive(7, rng.INIT) == expected
    assert len({rng.derive(7, s) for s in (rng.ENV, rng.EVAL_ENV, rng.INIT, rng.GLOBAL, rng.MINIBATCH)}) == 5
    assert rng.derive(7, rng.INIT) != rng.derive(8, rng.INIT)


def test_seed_everything_seeds_the_three_global_generators_reproducibly():
    draws = []
    for _ in range(2):
        rng.seed_everything(3, 1)
        draws.append((random.random(), np.random.rand(), torch.rand(()).item()))
    assert draws[0] == draws[1]
    rng.seed_everything(3, 0)
    assert (random.random(), np.random.rand(), torch.rand(()).item()) != draws[0]


def test_vmapped_rows_get_the_env_seeds_of_their_single_runs():
    rows = [Row(s, None, {}) for s in (4, 5, 6)]
    assert row_env_seeds(rows, 3) == rng.env_seeds(4, 3) + rng.env_seeds(5, 3) + rng.env_seeds(6, 3)


def test_an_env_pool_keeps_the_seed_of_each_env():
    seeds = rng.env_seeds(0, 4)
    env = envs.make("CartPole-v1", 4, seed=seeds, backend="envpool")
    single = envs.make("CartPole-v1", 1, seed=seeds[2:3], backend="envpool")
    try:
        assert env.seeds == seeds
        torch.testing.assert_close(env.reset()["obs"][2], single.reset()["obs"][0])
    finally:
        env.close()
        single.close()
    assert envs.make("CartPole-v1", 2, seed=10, backend="gymnasium").seeds == [10, 11]


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_seed_is_a_non_negative_integer(bad):
    with pytest.raises(ValueError):
        rng.derive(bad, rng.ENV)
