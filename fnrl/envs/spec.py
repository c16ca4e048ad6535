"""What a network builder needs to know about an environment."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EnvSpec:
    """Shapes, dtypes and bounds of a batched environment.

    obs_shape / obs_dtype: one observation (for Dict spaces, `obs_shape` maps key -> shape
        and `obs_dtype` key -> dtype).
    action_shape: () for discrete actions, (D,) for continuous ones.
    num_actions: number of discrete actions, or None for continuous.
    action_low / action_high: [D] bounds of a continuous action (None if discrete).
    """

    env_id: str
    num_envs: int
    obs_shape: tuple | dict
    obs_dtype: torch.dtype | dict
    action_shape: tuple
    action_dtype: torch.dtype
    num_actions: int | None = None
    action_low: torch.Tensor | None = None
    action_high: torch.Tensor | None = None
    max_episode_steps: int | None = None
    is_atari: bool = False

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    @property
    def action_dim(self) -> int:
        """Number of discrete actions, or the size of a continuous action."""
        return self.num_actions if self.discrete else int(self.action_shape[0])

    @property
    def obs_size(self) -> int:
        """Flat size of a vector observation."""
        if isinstance(self.obs_shape, dict):
            return sum(int(torch.Size(s).numel()) for s in self.obs_shape.values())
        return int(torch.Size(self.obs_shape).numel())
