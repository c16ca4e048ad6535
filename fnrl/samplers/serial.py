"""The serial sampler: EnvPool in-process, the policy in the main process.

It steps the env T times with the policy's `act`, writing every step into one
preallocated [T, B] TensorDict (no allocation per step beyond what the env returns),
and keeps the env's last observation and the policy's recurrent carry between calls.

Rollout keys ([T, B] unless noted): `obs`, `next_obs` (views into one [T + 1, B]
observation buffer, so `next_obs[t] is obs[t + 1]`), `action`, `reward`,
`terminated`, `truncated`, `done`, `valid`, `episode_end`, `episode_return`,
`episode_length` (see fnrl.envs.batched), and every extra that `act` returns
(`logp`, `value`, ...).

Recurrent agents (see fnrl.nets.recurrent for the full protocol). An agent is recurrent
when its `act`, first called with `carry=None`, returns a carry (a TensorDict [B]). The
sampler then keeps that carry between steps and between `collect` calls and, before
every call, sets `carry["reset"]` [B] bool: True where the observation is the first of
an episode, i.e. where the previous step was the env's reset step
(`reset[t] = not valid[t - 1]`; True at the very first step). `act` zeroes the carry
there. The rollout also holds `reset` [T, B] and, from the agent's
`extras["carry"]`, `carry` [T, B, ...]: the carry each step started from, so
`rollout["carry"][0]` is the state a training unroll of the segment starts from.
"""
from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDict

from fnrl.envs.batched import BatchedEnv
from fnrl.samplers.lane import Lane, RolloutBuffer


class SerialSampler:
    """Collect [T, B] rollouts with `act(state, obs, carry, explore) -> (action, extras, carry)`.

    `extras` is a dict (or TensorDict) of [B, ...] tensors that the policy wants kept
    (log-probs, values). `device` is where the policy runs and the rollout lives.
    The sampler owns `env` (`close()` closes it).
    """

    def __init__(self, env: BatchedEnv, act: Callable, horizon: int, device: str | torch.device = "cpu"):
        self.env, self.act, self.horizon = env, act, horizon
        self.device = torch.device(device)
        self.lane = Lane(env, act, slice(None), self.device, allocate=self._allocate)

    def _allocate(self, obs, action, extras, step, recurrent: bool) -> RolloutBuffer:
        return RolloutBuffer(self.horizon, self.env.num_envs, obs, action, extras, step, recurrent, self.device)

    @property
    def rollout(self) -> TensorDict | None:
        return self.lane.rollout

    @property
    def carry(self):
        return self.lane.carry

    @torch.no_grad()
    def collect(self, state, explore: bool = True) -> TensorDict:
        """Step the env `horizon` times; return the (reused) rollout TensorDict [T, B]."""
        lane, env = self.lane, self.env
        lane.begin()
        if lane.batched_bookkeeping:   # the flags and episode statistics once, after the steps
            for t in range(self.horizon):
                lane.record_raw(t, env.step_raw(lane.act(state, explore)))
            lane.finish(self.horizon)
        else:
            for t in range(self.horizon):
                lane.record(t, env.step_arrays(lane.act(state, explore)))
        return lane.rollout

    def state_dict(self) -> dict | None:
        """A snapshot of the envs mid-episode and the policy's carry (`Lane.state_dict`), where the env
        backend can take one (fnrl's in-process gymnasium envs); None for EnvPool envs."""
        return self.lane.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.lane.load_state_dict(saved)

    def close(self) -> None:
        self.env.close()
