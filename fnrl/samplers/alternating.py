"""The alternating sampler: two env groups whose steps overlap the policy (rlpyt's
AlternatingSampler, on EnvPool's `send` / `recv`).

The B envs are split into two EnvPools of B/2 envs, group 0 = envs [0, B/2) and group 1
= envs [B/2, B), each built with the seeds those envs have in one pool of B
(`env.factory`), so env j is always rollout column j and its trajectory is the one it
would have in the serial sampler over one EnvPool under the same actions. Each step:

    group 0: recv step t -> record -> act on obs[t+1] -> send    (group 1's envs are stepping)
    group 1: recv step t -> record -> act on obs[t+1] -> send    (group 0's envs are stepping)

so the policy's forward pass for one group runs while EnvPool's threads step the other.
Nothing is in flight between `collect` calls (the policy may change in between).
The rollout is the serial sampler's (fnrl.samplers.lane), recurrent carry included.
"""
from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDict

from fnrl import envs
from fnrl.envs.batched import BatchedEnv
from fnrl.errors import ConfigError
from fnrl.samplers.lane import Lane, RolloutBuffer


class AlternatingSampler:
    """Collect [T, B] rollouts from two EnvPool groups of B/2 envs stepped alternately.

    `env` is the B-env batch to mirror (of an EnvPool task, from fnrl.envs.make); the sampler
    closes it and builds its two groups from `env.factory`. Same `act` protocol and rollout
    as `SerialSampler`.
    """

    def __init__(self, env: BatchedEnv, act: Callable, horizon: int, device: str | torch.device = "cpu"):
        B = env.num_envs
        if B < 2 or B % 2:
            raise ConfigError(f"the alternating sampler splits the envs into two equal groups: --num-envs must be "
                              f"even and at least 2, got {B}")
        if env.factory is None or not envs.envpool_task(env.spec.env_id):
            raise ConfigError(f"the alternating sampler needs an EnvPool task built by fnrl.envs.make "
                              f"(send/recv); {env.spec.env_id} is not one: use --sampler serial")
        self.spec, self.act, self.horizon = env.spec, act, horizon
        self.device = torch.device(device)
        half = B // 2
        env.close()
        self.envs = [env.factory(half, env.seeds[g * half:(g + 1) * half], backend="envpool") for g in range(2)]   # send / recv
        self.buffer: RolloutBuffer | None = None
        self.lanes = [Lane(e, act, slice(g * half, (g + 1) * half), self.device, allocate=self._allocate)
                      for g, e in enumerate(self.envs)]
        self.num_envs = B

    def _allocate(self, obs, action, extras, step, recurrent: bool) -> RolloutBuffer:
        if self.buffer is None:
            self.buffer = RolloutBuffer(self.horizon, self.num_envs, obs, action, extras, step, recurrent,
                                        self.device)
        return self.buffer

    @property
    def rollout(self) -> TensorDict | None:
        return None if self.buffer is None else self.buffer.rollout

    @torch.no_grad()
    def collect(self, state, explore: bool = True) -> TensorDict:
        """Step every env `horizon` times; return the (reused) rollout TensorDict [T, B]."""
        T, pairs = self.horizon, list(zip(self.lanes, self.envs))
        for lane, env in pairs:
            lane.begin()
            env.send(lane.act(state, explore))
        batched = all(lane.batched_bookkeeping for lane in self.lanes)   # flags and statistics after the steps
        for t in range(T):
            for lane, env in pairs:
                if batched:
                    lane.record_raw(t, env.recv_raw())
                else:
                    lane.record(t, env.recv_arrays())
                if t + 1 < T:
                    env.send(lane.act(state, explore))
        if batched:
            for lane in self.lanes:
                lane.finish(T)
        return self.buffer.rollout

    def close(self) -> None:
        for env in self.envs:
            env.close()
