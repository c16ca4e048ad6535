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

import os
from time import perf_counter

import numpy as np
import torch
from tensordict import TensorDict

from fnrl.envs.spec import EnvSpec

NUMPY_TO_TORCH = {  # the torch dtype of each numpy dtype an env returns
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


POLL_VAR = "FNRL_ENV_POLL"
"""`0` in the environment: EnvPool envs made afterwards never poll (`EnvPoolCalls`). fnrl itself
turns polling off per env (`BatchedEnv.poll = False`) where other threads or processes keep the
cores busy: parallel-sampler workers, the async sampler, IMPALA's actors, `--nproc N` ranks and a
`fnrl train` run whose act or update runs on several threads."""


def polls(config: dict) -> bool:
    """Whether `EnvPoolCalls.recv` polls the clock for EnvPool's env with `config` (its `config`
    dict): where its worker threads leave this process a core of its own (fewer workers than
    the cores it may run on; `num_threads=0` is one worker per core, at most one per env),
    unless `$FNRL_ENV_POLL` is `0`."""
    if os.environ.get(POLL_VAR) == "0":
        return False
    cores = len(os.sched_getaffinity(0))
    workers = config.get("num_threads", 0) or min(config.get("num_envs", cores), cores)
    return workers < cores


class EnvPoolCalls:
    """EnvPool's C++ `_send` / `_recv` without its Python wrapper.

    EnvPool's gymnasium `step` spends most of its time in Python: converting the action
    into the C++ argument list and the returned state list into an info dict with a tree
    unflatten (most of a 4-env CartPole step; EnvPool time per 4-env x 128-step rollout
    fell from 24.5 to 13.9 ms with these calls, benchmarks/probes/ppo_breakdown.md).
    Here the argument list (`env_id`, `players.env_id`, `action`) is built once by
    EnvPool's own conversion of a first action, which EnvPool
    also validates then, and each step only swaps the action in; `recv` picks the arrays
    the adaptor uses out of the state list by position. Results are the very arrays the
    wrapper returns (`terminated = done & ~trunc`, as EnvPool computes it).

    `of(raw)` is None for anything but a synchronous single-player EnvPool env with one
    array observation: those keep the wrapper.

    Waiting (`poll`): EnvPool's `recv` puts the caller to sleep until its worker posts the
    step, and a thread woken from sleep pays twice: the wake-up itself and, after it, its
    own work runs on cold caches (on these 2-core VMs a 64-env PPO `act` took ~30 us right
    after a busy wait and ~60 us right after `recv`; `benchmarks/probes/env_wait.md`). Where a core
    is left over for the caller (EnvPool's worker threads fewer than this process's cores,
    as with the 1 thread of a classic-control task), `recv` first polls the clock until the
    step is about due, `POLL_SHARE` of its running mean duration after `send`, and only
    then calls EnvPool's `recv`, which by then sleeps little or not at all. The mean
    follows the time from `send` to the results (each sample clipped at twice the mean, so a
    stall of the host does not leave the caller polling for long), and work done between
    them leaves nothing to poll."""

    NEEDED = ("obs", "reward", "done", "trunc")
    POLL_SHARE = 0.7
    """The share of a step's mean duration `recv` polls the clock for before it calls EnvPool's."""

    def __init__(self, raw, keys: list[str], poll: bool = False):
        self.raw = raw
        self.index = {k: keys.index(k) for k in self.NEEDED}
        self.info = {k[len("info:"):]: i for i, k in enumerate(keys) if k in ("info:reward", "info:terminated")}
        self.dtype = raw._spec._action_spec[-1][0]
        self.args = None
        self.poll = poll
        self.step_s = 0.0   # running mean of a step's duration, send to results (seconds)
        self._sent = 0.0

    @classmethod
    def of(cls, raw) -> "EnvPoolCalls | None":
        keys = getattr(raw, "_state_keys", None)
        if not (keys and hasattr(raw, "_send") and hasattr(raw, "_recv") and hasattr(raw, "_from")):
            return None
        config = getattr(raw, "config", {})
        if config.get("batch_size", 0) not in (0, config.get("num_envs")) or config.get("max_num_players", 1) != 1:
            return None
        if not all(k in keys for k in cls.NEEDED) or any(k.startswith("obs:") for k in keys):
            return None
        return cls(raw, list(keys), poll=polls(config))

    def send(self, action: np.ndarray) -> None:
        if self.args is None:   # the first call: EnvPool converts and checks the action
            self.raw.send(action)
            self.args = self.raw._from(action)
        else:
            self.args[-1] = action.astype(self.dtype, copy=False)
            self.raw._send(self.args)
        self._sent = perf_counter()

    def recv(self) -> tuple:
        """(obs, reward, terminated, truncated, info) as EnvPool's gymnasium `recv` returns them
        (info: only `reward` and `terminated`, where the env reports them: Atari)."""
        if self.poll:
            due = self._sent + self.POLL_SHARE * self.step_s
            while perf_counter() < due:
                pass
            state = self.raw._recv()
            took = perf_counter() - self._sent   # clipped at twice the mean: one stall moves it 12.5% at most
            self.step_s += 0.125 * (min(took, 2 * self.step_s or took) - self.step_s)
        else:
            state = self.raw._recv()
        i = self.index
        done, trunc = state[i["done"]], state[i["trunc"]]
        return (state[i["obs"]], state[i["reward"]], done & ~trunc, trunc,
                {k: state[j] for k, j in self.info.items()})

    def step(self, action: np.ndarray) -> tuple:
        self.send(action)
        return self.recv()


class BatchedEnv:
    """B environments stepped together, as TensorDicts (see the module docstring).

    `raw_env` is an EnvPool env (env_type="gymnasium"), `fnrl.envs.inprocess.InProcessEnvs`
    or a gymnasium VectorEnv with next-step autoreset. `atari` switches the episode
    statistics to the raw game score over whole games (EnvPool's `info["reward"]`,
    `info["terminated"]`).

    `factory(num_envs, seeds)` builds more envs like these and `seeds` holds each env's seed
    (set by `fnrl.envs.make`; None for an env built by hand).
    """

    factory = None
    seeds = None

    def __init__(self, raw_env, spec: EnvSpec, atari: bool = False, seed: int | None = None,
                 obs_index: tuple[int, ...] | None = None):
        self.raw = raw_env
        # keep only these entries of a vector observation (partially observed variants)
        self._obs_index = None if obs_index is None else np.asarray(obs_index)
        self._seed = seed
        self.spec = spec
        self.atari = atari
        self.num_envs = spec.num_envs
        n = self.num_envs
        self._prev_done = np.zeros(n, dtype=bool)
        self._ep_return = np.zeros(n, dtype=np.float64)
        self._ep_length = np.zeros(n, dtype=np.int64)
        np_act = getattr(raw_env, "single_action_space", raw_env.action_space).dtype
        self._np_action_dtype = np.int32 if spec.discrete else np_act

    @property
    def raw(self):
        """The backend env (EnvPool or gymnasium); its steps go through `EnvPoolCalls` where it can."""
        return self._raw

    @raw.setter
    def raw(self, raw_env) -> None:
        self._raw = raw_env
        self._calls = EnvPoolCalls.of(raw_env) or raw_env   # `step` / `send` / `recv` of the backend

    @property
    def poll(self) -> bool:
        """Whether `recv` polls the clock before EnvPool's (`EnvPoolCalls`; False for other backends).
        Settable: a caller that keeps other threads busy while the envs step turns it off."""
        return getattr(self._calls, "poll", False)

    @poll.setter
    def poll(self, on: bool) -> None:
        if isinstance(self._calls, EnvPoolCalls):
            self._calls.poll = on

    def reset(self) -> TensorDict:
        if self._seed is not None and not hasattr(self.raw, "send"):  # gymnasium seeds at reset
            obs, _ = self.raw.reset(seed=self._seed)
            self._seed = None
        else:
            obs, _ = self.raw.reset()
        self._prev_done[:] = False
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        return TensorDict({"obs": self._obs(obs)}, batch_size=[self.num_envs])

    def obs_array(self, obs):
        """The backend's observation (numpy, or a dict of numpy) with only the kept entries."""
        return obs if self._obs_index is None else obs[..., self._obs_index]

    def _obs(self, obs):
        return _obs_to_torch(self.obs_array(obs), [self.num_envs])

    def _np_action(self, action: torch.Tensor) -> np.ndarray:
        if action.device.type != "cpu" or action.requires_grad:
            action = action.detach().cpu()
        return action.numpy().astype(self._np_action_dtype, copy=False)

    def step(self, action: torch.Tensor) -> dict:
        """One step of all envs: a dict of [B]-leading tensors (keys in the module docstring)."""
        return self.to_torch(self.step_arrays(action))

    def step_arrays(self, action: torch.Tensor) -> dict:
        """`step` before the conversion to torch: the flags and statistics as numpy arrays
        (and `obs` as the backend returned it). The bookkeeping is done in numpy, whose
        per-call cost on [B] arrays is a fraction of torch's eager dispatch."""
        return self._wrap(*self._calls.step(self._np_action(action)))

    def to_torch(self, out: dict) -> dict:
        """A `step_arrays` result as `step` returns it (zero-copy where the dtype allows)."""
        return {k: self._obs(v) if k == "obs" else torch.from_numpy(v) for k, v in out.items()}

    @property
    def backend(self) -> str:
        """"envpool" or "gymnasium": what steps these envs."""
        return "envpool" if self.can_send else "gymnasium"

    @property
    def can_send(self) -> bool:
        """True for EnvPool envs, which can step in the background (`send`, then `recv`)."""
        return hasattr(self.raw, "send") and hasattr(self.raw, "recv")

    def send(self, action: torch.Tensor) -> None:
        """Start stepping every env with `action` [B] and return at once (EnvPool only)."""
        self._calls.send(self._np_action(action))

    def recv(self) -> dict:
        """Wait for the step started by `send`; the same dict as `step` returns."""
        return self.to_torch(self.recv_arrays())

    def recv_arrays(self) -> dict:
        """`recv` before the conversion to torch (see `step_arrays`)."""
        return self._wrap(*self._calls.recv())

    def recv_raw(self) -> tuple:
        """`recv` without the bookkeeping: the backend's arrays, as `step_raw` returns them (EnvPool
        only; the same `finish_steps` duty)."""
        return self._calls.recv()

    def step_raw(self, action: torch.Tensor) -> tuple:
        """One step of all envs without the bookkeeping: the backend's
        `(obs, reward, terminated, truncated, info)` (numpy; `info` holds Atari's `reward` and
        `terminated`). A caller that steps T times this way and keeps the [T, B] arrays must
        call `finish_steps` on them once, in order, before the next `step`."""
        return self._calls.step(self._np_action(action))

    def finish_steps(self, steps: dict, score: np.ndarray | None = None,
                     lives_over: np.ndarray | None = None) -> None:
        """The flags and episode statistics of T consecutive steps at once, in place.

        `steps` holds [T, B] numpy arrays of the step keys (module docstring): `reward`,
        `terminated` and `truncated` are read, `done`, `valid`, `episode_end`,
        `episode_return` and `episode_length` written. Atari envs also take `score` [T, B],
        the raw game score (`info["reward"]`), and `lives_over` [T, B], the game-over flag
        (`info["terminated"]`). With running return R and length L per env (carried between
        calls):

            done_t = terminated_t | truncated_t,   valid_t = not done_{t-1}
            R_t = R_{t-1} [not end_{t-1}] + valid_t score_t     (score = reward but for Atari)
            episode_return_t = R_t [end_t],   episode_length_t likewise with valid_t for score_t

        computed with cumulative sums over t (one pass per key, not one per step): the same
        flags and lengths as T calls of `step_arrays`, the same returns up to float64 rounding."""
        terminated, truncated = steps["terminated"], steps["truncated"]
        done = np.logical_or(terminated, truncated, out=steps["done"])
        valid = steps["valid"]
        valid[0] = ~self._prev_done
        np.logical_not(done[:-1], out=valid[1:])
        self._prev_done = done[-1].copy()
        end = steps["episode_end"]
        if self.atari:
            np.logical_and(done, truncated | lives_over, out=end)
        else:
            end[...] = done
            score = steps["reward"]
        increment = np.where(valid, score.astype(np.float64, copy=False), 0.0)
        if not end.any():   # most calls: no episode ends, the sums carry on (~2x cheaper than below)
            increment[0] += self._ep_return
            self._ep_return = np.cumsum(increment, axis=0)[-1]
            self._ep_length = self._ep_length + np.count_nonzero(valid, axis=0)
            steps["episode_return"].fill(0)
            steps["episode_length"].fill(0)
            return
        T = len(done)
        # the last episode end strictly before t (-1: none in these T steps)
        last_end = np.maximum.accumulate(np.where(end, np.arange(T)[:, None], -1), axis=0)
        before = np.concatenate([np.full((1, end.shape[1]), -1), last_end[:-1]])
        self._ep_return = self._running(increment, self._ep_return, end, before, steps["episode_return"])
        self._ep_length = self._running(valid.astype(np.int64), self._ep_length, end, before,
                                        steps["episode_length"])

    @staticmethod
    def _running(increment, start, end, before, out) -> np.ndarray:
        """Write the running sums that end on `end` steps into `out`; return the sums carried on."""
        increment[0] += start
        total = np.cumsum(increment, axis=0)
        base = total[np.maximum(before, 0), np.arange(total.shape[1])] * (before >= 0)
        running = total - base
        np.copyto(out, np.where(end, running, 0))
        return np.where(end[-1], 0, running[-1])

    def _wrap(self, obs, reward, terminated, truncated, info) -> dict:
        """One step's dict from the backend's arrays: the per-step form of `finish_steps`
        (a dozen numpy calls on [B] arrays, where `finish_steps` on T = 1 would take ~30)."""
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        reward = np.asarray(reward, dtype=np.float32)
        done = terminated | truncated
        valid = ~self._prev_done
        self._prev_done = done

        if self.atari:
            score = np.asarray(info["reward"], dtype=np.float64)
            episode_end = done & (truncated | np.asarray(info["terminated"], dtype=bool))
        else:
            score, episode_end = reward, done
        self._ep_return += np.where(valid, score, 0.0)
        self._ep_length += valid
        if episode_end.any():
            episode_return = np.where(episode_end, self._ep_return, 0.0).astype(np.float32)
            episode_length = np.where(episode_end, self._ep_length, 0).astype(np.float32)
            self._ep_return[episode_end] = 0.0
            self._ep_length[episode_end] = 0
        else:   # most steps: nothing ended
            episode_return = np.zeros(self.num_envs, np.float32)
            episode_length = np.zeros(self.num_envs, np.float32)
        return {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, "done": done,
                "valid": valid, "episode_end": episode_end, "episode_return": episode_return,
                "episode_length": episode_length}

    def state_dict(self) -> dict | None:
        """The envs mid-episode, where the backend can snapshot them (fnrl's in-process gymnasium
        envs whose state is plain data: `InProcessEnvs.snapshot`), with the episode bookkeeping; else None
        (EnvPool cannot snapshot its envs)."""
        snapshot = getattr(self.raw, "snapshot", None)
        raw = snapshot() if snapshot is not None else None
        if raw is None:
            return None
        return {"raw": raw, "prev_done": self._prev_done.copy(), "ep_return": self._ep_return.copy(),
                "ep_length": self._ep_length.copy()}

    def load_state_dict(self, saved: dict) -> None:
        """Continue from `state_dict()`'s snapshot."""
        self.raw.restore(saved["raw"])
        self._seed = None   # seeded already: a later reset must not reseed
        self._prev_done, self._ep_return, self._ep_length = (saved[k].copy() for k in ("prev_done", "ep_return",
                                                                                       "ep_length"))

    def step_td(self, action: torch.Tensor) -> TensorDict:
        """`step` as a TensorDict with batch size [B]."""
        return TensorDict(self.step(action), batch_size=[self.num_envs])

    def close(self) -> None:
        close = getattr(self.raw, "close", None)
        if close is not None:
            close()
