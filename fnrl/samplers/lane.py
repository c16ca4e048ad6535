"""One group of envs stepped by a policy, written into columns of a [T, B] rollout.

Every sampler is built from lanes: the serial sampler is one lane over all B envs,
the alternating sampler two lanes (B/2 envs each) whose env steps overlap, and each
parallel worker one lane writing into its column slice of a shared-memory rollout.
A lane owns the per-env state a rollout needs between steps and between collects:
the last observation, the policy's recurrent carry and the episode-start mask.

One step is split in two halves so that env stepping can overlap other work:

    action = lane.act(state, t, explore)    # policy on obs[t] (carry, reset handled)
    step = env.step(action)                 # or env.send(action) ... env.recv()
    lane.record(t, step)                    # writes step t, obs[t + 1]

Rollout keys ([T, B] unless noted): `obs`, `next_obs` (views into one [T + 1, B]
observation buffer, so `next_obs[t] is obs[t + 1]`), `action`, the step keys of
fnrl.envs.batched (`reward`, `terminated`, `truncated`, `done`, `valid`,
`episode_end`, `episode_return`, `episode_length`), every extra that `act` returns,
and for recurrent agents `reset` [T, B] bool (see fnrl.samplers.serial).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tensordict import TensorDict

from fnrl.errors import ConfigError

STEP_KEYS = ("reward", "terminated", "truncated", "done", "valid", "episode_end", "episode_return",
             "episode_length")


def _zeros(x, lead: tuple[int, ...], device, share: bool):
    """A zeroed [*lead, *x.shape[1:]] buffer for a [b, ...] tensor or TensorDict example."""
    if isinstance(x, TensorDict):
        buf = x[0].expand(*lead).to(device).clone().zero_()
    else:
        buf = torch.zeros((*lead, *x.shape[1:]), dtype=x.dtype, device=device)
    return buf.share_memory_() if share else buf


class RolloutBuffer:
    """A preallocated [T, B] rollout plus its [T + 1, B] observation buffer.

    Built from one step's examples (each [b, ...] for any b; only the trailing shapes and
    dtypes are used). `share=True` puts every tensor in shared memory (CPU only), so worker
    processes can write their columns in place.
    """

    def __init__(self, horizon: int, num_envs: int, obs, action, extras: dict, step: dict, recurrent: bool,
                 device="cpu", share: bool = False):
        T, B = horizon, num_envs
        self.obs = _zeros(obs, (T + 1, B), device, share)
        fields = {"action": _zeros(action, (T, B), device, share)}
        fields.update({k: _zeros(step[k], (T, B), device, share) for k in STEP_KEYS})
        fields.update({k: _zeros(v, (T, B), device, share) for k, v in extras.items()})
        if recurrent:
            fields["reset"] = _zeros(torch.zeros(1, dtype=torch.bool), (T, B), device, share)
        self.fields = fields
        self.recurrent = recurrent
        self.rollout = self.view(slice(None))

    def __getstate__(self):   # pickled to worker processes: the tensors (shared memory handles) only
        return {"obs": self.obs, "fields": self.fields, "recurrent": self.recurrent}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self.rollout = self.view(slice(None))

    def clone(self, device) -> "RolloutBuffer":
        """A copy on `device` (its own memory, same layout)."""
        out = object.__new__(RolloutBuffer)
        out.__setstate__({"obs": self.obs.to(device).clone(),
                          "fields": {k: v.to(device).clone() for k, v in self.fields.items()},
                          "recurrent": self.recurrent})
        return out

    def copy_(self, other: "RolloutBuffer") -> "RolloutBuffer":
        """Copy `other`'s contents into this buffer, in place."""
        self.obs.copy_(other.obs)
        for k, v in self.fields.items():
            v.copy_(other.fields[k])
        return self

    def view(self, columns: slice) -> TensorDict:
        """The rollout restricted to env columns `columns` (views: writes land in this buffer)."""
        obs = self.obs[:, columns]
        fields = {"obs": obs[:-1], "next_obs": obs[1:], **{k: v[:, columns] for k, v in self.fields.items()}}
        T = obs.shape[0] - 1
        return TensorDict(fields, batch_size=[T, obs.shape[1]], device=obs.device)


class Lane:
    """Envs [lo, hi) of a rollout: `env` (a BatchedEnv of hi - lo envs) stepped by `act`.

    `allocate(obs, action, extras, step, recurrent) -> RolloutBuffer` is called once, at
    the first recorded step, unless `bind(buffer)` was called before; the lane then writes
    into `buffer.view(columns)`.
    """

    def __init__(self, env, act: Callable, columns: slice, device="cpu", allocate: Callable | None = None):
        self.env, self.act_fn, self.columns = env, act, columns
        self.device = torch.device(device)
        self.allocate = allocate
        self.buffer: RolloutBuffer | None = None
        self.carry = None
        self._reset = torch.ones(env.num_envs, dtype=torch.bool, device=self.device)
        self._obs = env.reset()["obs"].to(self.device)   # the observation the next action is chosen from
        self._pending = None
        self.batched_bookkeeping = False   # set by `bind` (see `record_raw`)
        self._collected = False   # a step has been recorded: obs[T] of the buffer is the last observation

    def bind(self, buffer: RolloutBuffer) -> None:
        self.buffer = buffer
        self._view = buffer.view(self.columns)
        self._obs_buf = buffer.obs[:, self.columns]
        self._writes = {k: v for k, v in self._view.items() if k not in ("obs", "next_obs")}
        # numpy views of the CPU buffers: the env's numpy outputs (and the policy's tensors, as
        # numpy views) are written without torch's indexing, ~0.5 instead of ~4 us a write
        on_cpu = self._obs_buf.device.type == "cpu"
        self._np_writes = {k: self._writes[k].numpy() for k in STEP_KEYS} if on_cpu else None
        self._np_obs = self._obs_buf.numpy() if on_cpu and isinstance(self._obs_buf, torch.Tensor) else None
        self._np_policy = ({k: v.numpy() for k, v in self._writes.items()
                            if k not in STEP_KEYS and isinstance(v, torch.Tensor)} if on_cpu else {})
        self._obs_rows = self._obs_buf.unbind(0)   # obs[t] views
        # `record_raw` + `finish`: the flags and episode statistics once per collect, not per step
        self.batched_bookkeeping = self._np_writes is not None and not buffer.recurrent
        if self.batched_bookkeeping and self.env.atari:
            shape = self._np_writes["reward"].shape
            self._score, self._lives_over = np.zeros(shape), np.zeros(shape, dtype=bool)

    def state_dict(self) -> dict | None:
        """What the next collect starts from, where the env can snapshot itself (`BatchedEnv.state_dict`):
        the env, the last observation and a recurrent policy's carry and episode-start mask; else None."""
        env = self.env.state_dict()
        if env is None:
            return None
        return {"env": env, "obs": self._obs.clone(), "reset": self._reset.clone(),
                "carry": None if self.carry is None else self.carry.clone()}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from `state_dict()`'s snapshot (before the first collect)."""
        if saved["obs"].shape != self._obs.shape:
            raise ConfigError(f"the checkpoint's envs observe {list(saved['obs'].shape)}, these {list(self._obs.shape)}; "
                              "resume with the env and --num-envs it was written with")
        self.env.load_state_dict(saved["env"])
        self._obs = saved["obs"].to(self.device)
        self._reset = saved["reset"].to(self.device)
        self.carry = None if saved["carry"] is None else saved["carry"].to(self.device)

    def begin(self) -> None:
        """Start a collect: obs[0] is the last observation of the previous one."""
        if self._collected:
            if self._np_obs is not None:   # numpy's copy of a CPU row: a fraction of torch's indexing
                self._np_obs[0] = self._np_obs[-1]
            else:
                self._obs_buf[0] = self._obs_buf[-1]
            self._obs = self._obs_rows[0]

    def act(self, state, explore: bool = True):
        """The policy's action for the current observation (the step's extras are kept until `record`).
        Called under `torch.no_grad()` (the samplers' collects)."""
        reset, carry = self._reset, self.carry
        if carry is not None:
            carry = carry.clone(recurse=False)
            carry["reset"] = reset
        action, extras, self.carry = self.act_fn(state, self._obs, carry, explore)
        self._pending = (action, extras, reset)
        return action

    def record(self, t: int, step: dict) -> None:
        """Write step t (the env's answer to the last `act`) and obs[t + 1].

        `step` is `env.step(...)`'s dict of tensors or `env.step_arrays(...)`'s of numpy
        arrays; arrays are written through numpy views where the rollout is on the CPU."""
        action, extras, reset = self._pending
        arrays = isinstance(step["valid"], np.ndarray)
        if self.buffer is None:
            example = self.env.to_torch(step) if arrays else step
            self._reset = ~example["valid"].to(self.device)
            self.bind(self.allocate(self._obs, action, extras, example, self.carry is not None))
        elif self.buffer.recurrent:
            valid = torch.from_numpy(step["valid"]) if arrays else step["valid"]
            self._reset = ~valid.to(self.device)
        if arrays and self._np_writes is not None:
            self._write_obs_array(t, step["obs"])
            for k, buf in self._np_writes.items():
                buf[t] = step[k]
        else:
            step = self.env.to_torch(step) if arrays else step
            if t == 0:
                self._obs_buf[0] = self._obs
            self._obs_buf[t + 1] = step["obs"]
            for k in STEP_KEYS:
                self._writes[k][t] = step[k]
        self._write_policy(t, action, extras, reset if self.buffer.recurrent else None)

    def record_raw(self, t: int, raw: tuple) -> None:
        """`record` for `env.step_raw(...)`'s arrays, where `batched_bookkeeping` is set (a CPU
        rollout of a feed-forward policy, once the buffer exists): writes obs[t + 1], the
        step's reward, terminated and truncated, the action and the extras; `finish` then
        fills the other step keys of steps 0 .. t at once."""
        obs, reward, terminated, truncated, info = raw
        action, extras, _ = self._pending
        self._write_obs_array(t, obs)
        w = self._np_writes
        w["reward"][t], w["terminated"][t], w["truncated"][t] = reward, terminated, truncated
        if self.env.atari:
            self._score[t], self._lives_over[t] = info["reward"], info["terminated"]
        self._write_policy(t, action, extras)

    def finish(self, steps: int) -> None:
        """After `record_raw` of steps 0 .. steps - 1: their flags and episode statistics
        (`BatchedEnv.finish_steps`), as `record` of `env.step_arrays` would have written them."""
        rows = {k: v[:steps] for k, v in self._np_writes.items()}
        if self.env.atari:
            self.env.finish_steps(rows, self._score[:steps], self._lives_over[:steps])
        else:
            self.env.finish_steps(rows)

    def _write_obs_array(self, t: int, obs) -> None:
        """obs[t + 1] from the backend's numpy observation (and obs[0] at t = 0)."""
        if t == 0:
            self._obs_buf[0] = self._obs
        if self._np_obs is not None:
            self._np_obs[t + 1] = self.env.obs_array(obs)
        else:
            self._obs_buf[t + 1] = self.env._obs(obs)

    def _write_policy(self, t: int, action, extras, reset=None) -> None:
        """Step t's action, extras (and episode-start mask `reset` of a recurrent agent); the
        next action is then chosen from obs[t + 1]."""
        self._write(t, "action", action)
        for k, v in extras.items():
            self._write(t, k, v)
        if reset is not None:
            self._write(t, "reset", reset)
        self._obs = self._obs_rows[t + 1]
        self._collected = True

    def _write(self, t: int, key: str, value) -> None:
        view = self._np_policy.get(key)
        if view is not None and isinstance(value, torch.Tensor) and value.device.type == "cpu" \
                and not value.requires_grad:
            view[t] = value.numpy()
        else:
            self._writes[key][t] = value

    @property
    def rollout(self) -> TensorDict | None:
        return None if self.buffer is None else self._view
