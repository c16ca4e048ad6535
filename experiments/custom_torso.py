"""A torso of your own in place of fnrl's: a residual MLP with LayerNorm for vector observations.

    fnrl train ppo --conv experiments.custom_torso:residual_mlp        # from the repository's root
    fnrl train dqn --conv experiments.custom_torso:residual_mlp

`--conv module:name` names a factory `factory(obs_shape) -> (nn.Module, feature size)`; the
algorithm puts its heads on the module's features (PPO / A2C / IMPALA: policy and value heads;
DQN and its variants: the Q head; R2D1: the recurrent core) and trains its parameters with the
rest (`fnrl.nets.core.user_torso`). The name travels with the run in config.json, so evaluation,
`--resume`, `fnrl eval` and sampler workers build the same network; the module must be
importable wherever they run.
"""
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
