"""A torso of your own in place of fnrl's: a residual MLP with LayerNorm for vector observations.

    fnrl train ppo --conv experiments.custom_torso:residual_mlp        # from the repository's root
    fnrl train dqn --conv experiments.custom_torso:residual_mlp
    python -m experiments.custom_torso                                 # make(..., network=) in a loop of your own

`--conv module:name` names a factory `factory(obs_shape) -> (nn.Module, feature size)`; the
algorithm puts its heads on the module's features (PPO / A2C / IMPALA: policy and value heads;
DQN and its variants: the Q head; R2D1: the recurrent core) and trains its parameters with the
rest (`fnrl.nets.core.user_torso`). The name travels with the run in config.json, so evaluation,
`--resume`, `fnrl eval` and sampler workers build the same network; the module must be
importable wherever they run.

In code, `ALGO.make(config, spec, network=...)` takes the torso itself: a factory as above, or
an nn.Module (its current weights are every `init`'s: a pretrained encoder, say). The agent's
`init`, `act` and `update` are the same pure functions as with the built-in torso; `main` below
trains PPO that way with the serial sampler, in a loop of a few lines.
"""
import argparse

import torch
from torch import nn


class ResidualMLP(nn.Module):
    """obs [..., D] -> features [..., width]: a linear embedding, then `blocks` residual
    LayerNorm -> Linear -> ReLU blocks."""

    def __init__(self, obs_size: int, width: int = 64, blocks: int = 2):
        super().__init__()
        self.embed = nn.Linear(obs_size, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU())
                                    for _ in range(blocks))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.embed(obs.float())
        for block in self.blocks:
            h = h + block(h)
        return h


def residual_mlp(obs_shape: tuple) -> tuple[nn.Module, int]:
    """The factory `--conv experiments.custom_torso:residual_mlp` names (vector observations)."""
    if len(obs_shape) != 1:
        raise ValueError(f"residual_mlp takes vector observations, got shape {obs_shape}")
    return ResidualMLP(obs_shape[0]), 64


def main(total_steps: int = 100_000, seed: int = 0) -> float:
    """PPO on CartPole-v1 with a ResidualMLP given to `make`, trained by a hand-written loop;
    returns the mean return of the last 20 finished episodes."""
    from fnrl import envs, rng
    from fnrl.algos import ppo
    from fnrl.samplers.serial import SerialSampler

    config = ppo.Config(env_id="CartPole-v1", total_steps=total_steps)
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    agent = ppo.make(config, env.spec, network=ResidualMLP(env.spec.obs_shape[0]))
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    finished: list[float] = []
    for _ in range(total_steps // (config.num_envs * config.num_steps)):
        rollout = sampler.collect(state)
        finished += rollout["episode_return"][rollout["episode_end"]].tolist()
        state, metrics = agent.update(state, rollout)
    sampler.close()
    recent = finished[-20:]
    return sum(recent) / max(len(recent), 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"mean return of the last 20 episodes: {main(args.total_steps, args.seed):.1f}")
