"""Synchronous data-parallel training (see `data_parallel` for the design).

    torchrun --standalone --nproc_per_node=2 -m fnrl train ppo --env CartPole-v1
    fnrl train ppo --env CartPole-v1 --nproc 2          # the same, launched for you
    train("ppo", config, nproc=2)                       # from Python (rank 0's result)
"""
from fnrl.distributed.data_parallel import (TIMEOUT_ENV, ProcessGroupWorld, World, all_reduce_mean,
                                            world_from_env)

__all__ = ["TIMEOUT_ENV", "ProcessGroupWorld", "World", "all_reduce_mean", "world_from_env"]
