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

_STEP_KEYS = ("reward", "terminated", "truncated", "done", "valid", "episode_end", "episode_return",
              "episode_length")


def _buffer_like(x, T: int, device):
    """A zeroed [T, *x.shape] buffer for a tensor or a TensorDict."""
    if isinstance(x, TensorDict):
        return x.unsqueeze(0).expand(T, *x.batch_size).to(device).clone().zero_()
    return torch.zeros((T, *x.shape), dtype=x.dtype, device=device)


class SerialSampler:
    """Collect [T, B] rollouts with `act(state, obs, carry, explore) -> (action, extras, carry)`.

    `extras` is a dict (or TensorDict) of [B, ...] tensors that the policy wants kept
    (log-probs, values). `device` is where the policy runs and the rollout lives.
    """

    def __init__(self, env: BatchedEnv, act: Callable, horizon: int, device: str | torch.device = "cpu"):
        self.env, self.act, self.horizon = env, act, horizon
        self.device = torch.device(device)
        self.rollout: TensorDict | None = None
        self.carry = None
        self._recurrent = False
        self._reset = torch.ones(env.num_envs, dtype=torch.bool, device=self.device)
        self._first_obs = env.reset()["obs"].to(self.device)

    def _allocate(self, obs, action, extras, step, recurrent: bool):
        T, B = self.horizon, self.env.num_envs
        obs_buf = _buffer_like(obs, T + 1, self.device)
        # the env's flags and statistics: written from numpy into CPU buffers (on another
        # device, staged there and copied over once per collect)
        env_cpu = {k: torch.zeros((T, *v.shape), dtype=torch.from_numpy(v).dtype) for k, v in step.items()
                   if k in _STEP_KEYS}
        on_cpu = self.device.type == "cpu"
        fields = {"obs": obs_buf[:-1], "next_obs": obs_buf[1:], "action": _buffer_like(action, T, self.device)}
        fields.update(env_cpu if on_cpu else {k: v.to(self.device) for k, v in env_cpu.items()})
        fields.update({k: _buffer_like(v, T, self.device) for k, v in extras.items()})
        if recurrent:
            fields["reset"] = _buffer_like(self._reset, T, self.device)
        self._obs_buf = obs_buf
        self.rollout = TensorDict(fields, batch_size=[T, B], device=self.device)
        self._env_cpu = env_cpu
        self._env_np = {k: v.numpy() for k, v in env_cpu.items()}
        # numpy view of the observation buffer when observations can be written without torch
        self._obs_np = obs_buf.numpy() if on_cpu and isinstance(obs_buf, torch.Tensor) else None
        # plain tensor handles for the per-step writes (TensorDict lookups cost more)
        self._writes = {k: fields[k] for k in ("action", *extras.keys(), *fields.keys() & {"reset"})}
        self._recurrent = recurrent

    @torch.no_grad()
    def collect(self, state, explore: bool = True) -> TensorDict:
        """Step the env `horizon` times; return the (reused) rollout TensorDict [T, B]."""
        if self.rollout is None:
            obs = self._first_obs
        else:
            self._obs_buf[0] = self._obs_buf[-1]
            obs = self._obs_buf[0]
        for t in range(self.horizon):
            reset, carry = self._reset, self.carry
            if carry is not None:
                carry = carry.clone(recurse=False)
                carry["reset"] = reset
            action, extras, self.carry = self.act(state, obs, carry, explore)
            step = self.env.step_arrays(action)
            if self._recurrent or self.rollout is None:
                self._reset = torch.from_numpy(~step["valid"]).to(self.device)
            if self.rollout is None:
                self._allocate(obs, action, extras, step, recurrent=self.carry is not None)
                self._obs_buf[0] = obs
            if self._obs_np is not None:
                self._obs_np[t + 1] = self.env.obs_array(step["obs"])
            else:
                self._obs_buf[t + 1] = self.env._obs(step["obs"])
            for k, buf in self._env_np.items():
                buf[t] = step[k]
            writes = self._writes
            writes["action"][t] = action
            for k, v in extras.items():
                writes[k][t] = v
            if self._recurrent:
                writes["reset"][t] = reset
            obs = self._obs_buf[t + 1]
        if self.device.type != "cpu":
            for k, v in self._env_cpu.items():
                self.rollout[k].copy_(v, non_blocking=True)
        return self.rollout
