"""Frame-deduplicated Atari observations (rlpyt's frame buffer, for EnvPool's frame stacks).

EnvPool Atari observations are uint8 stacks [S, H, W] (S = 4, oldest frame first) that
slide by one frame per step, so a replay row only needs the newest frame obs[t, -1] and
the stack is rebuilt from the frames of rows t-S+1 .. t of the same env.

What EnvPool 1.2.5 puts in the stack at a reset (measured on Pong-v5 and Breakout-v5):
- a real reset (game over, `max_episode_steps`, and the first `reset()`) fills all S
  slots with copies of the first frame: [f0, f0, f0, f0], then [f0, f0, f0, f1], ...
  (no zeros);
- with `episodic_life=True`, the step after a life loss still reports done and spends a
  step resetting, but the stack keeps sliding across it ([.., f_final, f_new]).
So a stack restarts exactly at a row whose previous row is a reset step (valid=False) or
that is the first row ever written, *and* whose S slots are all equal. That second test
tells a real reset from a life-loss reset without needing `lives` or `info`, and is exact
even when it misfires: if all S slots are equal, clamping to that row rebuilds the same
pixels either way.  Rebuilding clamps every slot older than the latest stack start to
the start row's frame, so two episodes never mix.
"""
from __future__ import annotations

import torch

__all__ = ["stack_starts", "stack_source_rows"]


def stack_starts(obs: torch.Tensor, follows_reset: torch.Tensor) -> torch.Tensor:
    """Rows where a frame stack restarts: follows_reset & (all S slots equal the newest).

    obs: uint8 [T, B, S, H, W]; follows_reset: bool [T, B] (previous row of the env is a
    reset step, or no previous row was ever written). Only candidate rows are compared.
    Returns bool [T, B].
    """
    starts = torch.zeros_like(follows_reset)
    rows = follows_reset.nonzero(as_tuple=True)
    stacks = obs[rows]                                           # [K, S, H, W]
    starts[rows] = (stacks[:, :-1] == stacks[:, -1:]).flatten(1).all(1)
    return starts


def stack_source_rows(row: torch.Tensor, env: torch.Tensor, start: torch.Tensor, oldest: int,
                      stack: int) -> torch.Tensor:
    """Absolute rows whose newest frames make up the stack of absolute row `row` of env `env`.

    slot k (k = 0..S-1, oldest first) comes from row r_k = max(row - (S-1) + k, s), where s
    is the latest stack start among rows row-S+1 .. row that are still stored (>= oldest),
    or -inf if there is none.
    row, env: int64 [...] (broadcastable); start: bool [C, B] ring of stack-start flags,
    row r at position r % C; oldest: oldest absolute row still stored; stack: S.
    Returns int64 [..., S]. The stack can be rebuilt iff result[..., 0] >= oldest.
    """
    row, env = torch.broadcast_tensors(row, env)
    offsets = torch.arange(1 - stack, 1, device=row.device)
    rows = row.unsqueeze(-1) + offsets                                       # [..., S]
    capacity = start.shape[0]
    flagged = start[rows % capacity, env.unsqueeze(-1)] & (rows >= oldest)
    latest = (flagged * torch.arange(stack, device=row.device)).amax(-1, keepdim=True)
    return torch.maximum(rows, rows.gather(-1, latest))
