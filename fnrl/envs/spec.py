"""What a network builder needs to know about an environment."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EnvSpec:
    """Shapes, dtypes and bounds of a batched environment.

    obs_shape / obs_dtype: one observation (for Dict spaces, `obs_shape` maps key -> shape
        and `obs_dtype` key -> dtype).
    action_shape: () for discrete actions, (D,) for continuous ones, (K,) for multi-discrete ones.
    num_actions: number of discrete actions, or None for continuous and multi-discrete ones.
    action_low / action_high: [D] bounds of a continuous action (None otherwise).
    action_nvec: a multi-discrete action's number of choices of each of its K parts (gymnasium's
        MultiDiscrete `nvec`; MultiBinary(K) is K parts of 2 choices); None otherwise. Its
        actions are int64 [K], part k in [0, nvec[k]).
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
    action_nvec: tuple | None = None

    @property
    def discrete(self) -> bool:
        """One discrete action (gymnasium's Discrete)."""
        return self.num_actions is not None

    @property
    def multi_discrete(self) -> bool:
        """Several discrete parts to an action (gymnasium's MultiDiscrete or MultiBinary)."""
        return self.action_nvec is not None

    @property
    def continuous(self) -> bool:
        return not self.discrete and not self.multi_discrete

    @property
    def action_dim(self) -> int:
        """The width of a policy's action head: the number of discrete actions, the logits of a
        multi-discrete action (the sum of `action_nvec`), or the size of a continuous action."""
        if self.discrete:
            return self.num_actions
        return sum(self.action_nvec) if self.multi_discrete else int(self.action_shape[0])

    @property
    def obs_size(self) -> int:
        """Flat size of a vector observation."""
        if isinstance(self.obs_shape, dict):
            return sum(int(torch.Size(s).numel()) for s in self.obs_shape.values())
        return int(torch.Size(self.obs_shape).numel())
