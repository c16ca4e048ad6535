"""One step contract over EnvPool and gymnasium vector environments.

Both backends reset an env on the step *after* it reports done ("next-step"
autoreset): that step returns the reset observation and reward 0 and ignores the
action. The adaptor reports it as `valid=False`. Because of this delay the
observation returned on a done step is the true final observation, so
`next_obs[t] == obs[t + 1]` for every env and step, across episode ends and
truncations alike, and truncated episodes can bootstrap from it.

`step(action)` returns a dict of [B]-leading tensors (`step_td` wraps it in a TensorDict):

| key | shape | meaning |
|---|---|---|
| obs | [B, *obs] | observation after the step (the final one on a done step) |
| reward | [B] float32 | reward of the step (clipped for Atari training envs) |
| terminated / truncated / done | [B] bool | episode end flags of the step |
| valid | [B] bool | False on the reset step, whose action the env ignored |
| episode_end | [B] bool | a whole episode (a game, for Atari) finished on this step |
| episode_return / episode_length | [B] float32 | its undiscounted raw score and length (0 elsewhere) |
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from fnrl.envs.spec import EnvSpec

_NUMPY_TO_TORCH = {
    np.dtype("float32"): torch.float32,
    np.dtype("float64"): torch.float32,  # MuJoCo: float64 observations are cast to float32
    np.dtype("uint8"): torch.uint8,
    np.dtype("int32"): torch.int32,
    np.dtype("int64"): torch.int64,
    np.dtype("bool"): torch.bool,
}


def _to_torch(x: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.float() if t.dtype == torch.float64 else t


def _obs_to_torch(obs, batch_size):
    """numpy -> torch without copies; a dict observation becomes a nested TensorDict."""
    if isinstance(obs, dict):
        return TensorDict({k: _obs_to_torch(v, batch_size) for k, v in obs.items()}, batch_size=batch_size)
    return _to_torch(obs)


class BatchedEnv:
    """B environments stepped together, as TensorDicts (see the module docstring).

    `raw_env` is an EnvPool env (env_type="gymnasium") or a gymnasium VectorEnv with
    next-step autoreset. `atari` switches the episode statistics to the raw game score
    over whole games (EnvPool's `info["reward"]`, `info["terminated"]`).

    `factory(num_envs, seed)` builds more envs like these and `seed` is this batch's seed
    (set by `fnrl.envs.make`; None for an env built by hand).
    """

    factory = None
    seed = None

    def __init__(self, raw_env, spec: EnvSpec, atari: bool = False, seed: int | None = None,
                 obs_index: tuple[int, ...] | None = None):
        self.raw = raw_env
        # keep only these entries of a vector observation (partially observed variants)
        self._obs_index = None if obs_index is None else torch.tensor(obs_index)
        self._seed = seed
        self.spec = spec
        self.atari = atari
        self.num_envs = spec.num_envs
        n = self.num_envs
        self._prev_done = torch.zeros(n, dtype=torch.bool)
        self._ep_return = torch.zeros(n, dtype=torch.float64)
        self._ep_length = torch.zeros(n, dtype=torch.int64)
        np_act = getattr(raw_env, "single_action_space", raw_env.action_space).dtype
        self._np_action_dtype = np.int32 if spec.discrete else np_act

    def reset(self) -> TensorDict:
        if self._seed is not None and not hasattr(self.raw, "send"):  # gymnasium seeds at reset
            obs, _ = self.raw.reset(seed=self._seed)
            self._seed = None
        else:
            obs, _ = self.raw.reset()
        self._prev_done.zero_()
        self._ep_return.zero_()
        self._ep_length.zero_()
        return TensorDict({"obs": self._obs(obs)}, batch_size=[self.num_envs])

    def _obs(self, obs):
        obs = _obs_to_torch(obs, [self.num_envs])
        return obs if self._obs_index is None else obs.index_select(-1, self._obs_index)

    def _np_action(self, action: torch.Tensor) -> np.ndarray:
        return action.detach().cpu().numpy().astype(self._np_action_dtype, copy=False)

    def step(self, action: torch.Tensor) -> dict:
        return self._wrap(*self.raw.step(self._np_action(action)))

    @property
    def can_send(self) -> bool:
        """True for EnvPool envs, which can step in the background (`send`, then `recv`)."""
        return hasattr(self.raw, "send") and hasattr(self.raw, "recv")

    def send(self, action: torch.Tensor) -> None:
        """Start stepping every env with `action` [B] and return at once (EnvPool only)."""
        self.raw.send(self._np_action(action))

    def recv(self) -> dict:
        """Wait for the step started by `send`; the same dict as `step` returns."""
        return self._wrap(*self.raw.recv())

    def _wrap(self, obs, reward, terminated, truncated, info) -> dict:
        terminated = torch.from_numpy(np.asarray(terminated, dtype=bool))
        truncated = torch.from_numpy(np.asarray(truncated, dtype=bool))
        reward = torch.from_numpy(np.asarray(reward, dtype=np.float32))
        done = terminated | truncated
        valid = ~self._prev_done
        self._prev_done = done

        if self.atari:
            score = torch.from_numpy(np.asarray(info["reward"], dtype=np.float64))
            episode_end = done & (truncated | torch.from_numpy(np.asarray(info["terminated"], dtype=bool)))
        else:
            score, episode_end = reward.double(), done
        self._ep_return += torch.where(valid, score, 0.0)
        self._ep_length += valid.long()
        episode_return = torch.where(episode_end, self._ep_return, 0.0).float()
        episode_length = torch.where(episode_end, self._ep_length, 0).float()
        self._ep_return.masked_fill_(episode_end, 0.0)
        self._ep_length.masked_fill_(episode_end, 0)

        return {
            "obs": self._obs(obs),
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "done": done,
            "valid": valid,
            "episode_end": episode_end,
            "episode_return": episode_return,
            "episode_length": episode_length,
        }

    def step_td(self, action: torch.Tensor) -> TensorDict:
        """`step` as a TensorDict with batch size [B]."""
        return TensorDict(self.step(action), batch_size=[self.num_envs])

    def close(self) -> None:
        close = getattr(self.raw, "close", None)
        if close is not None:
            close()
