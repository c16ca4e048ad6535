"""The graph sampler: the env's dynamics in torch, the whole [T, B] rollout one compiled call.

The serial sampler pays, every env step, a call into the policy's compiled model, a
hand-off to EnvPool's worker thread and back, and the Python that writes the step into
the rollout. This sampler steps a functional env instead (`fnrl.envs.functional`: the
task's dynamics as torch ops) inside a `scan` over T steps of

    action, extras = act(state, obs)          # the policy: forward, sampling, log-prob, value
    env_state, step = env.step(env_state, action)

and compiles that scan, with the writes into the rollout buffer, as one AOTInductor
model (`fnrl.accel.aot.AotFunction`), as purejaxrl compiles its rollout with gymnax's envs.
A collect is one call of that model: no Python, numpy or thread hand-off per step.

    env = fnrl.envs.functional.make("CartPole-v1", num_envs=64, seed=0)
    sampler = GraphSampler(env, agent.act, horizon=128)     # or fnrl train ... --sampler graph
    rollout = sampler.collect(state)                        # [T, B], keys of fnrl.samplers.lane

It serves PPO and A2C, feed-forward or recurrent (`--core lstm|gru`: the policy's carry
travels in the scan with the env's state, under the serial sampler's protocol: `carry["reset"]`
is set before every step, and the rollout holds `reset` and the `carry` each step started
from), and the off-policy algorithms whose rollouts go into a row replay (the DQN family on
the discrete tasks, DDPG / TD3 / SAC on the continuous ones; their replay add and updates
run as with any sampler). `act` is compiled into the rollout when it is an
`fnrl.accel.aot.AotAct` (what `fnrl.train` makes of a compiled run's act; its `select`ed state
keys are the model's inputs), and the scan runs eagerly otherwise (`--no-compile`).

Randomness: the compiled model draws from Inductor's generator, seeded from torch's global
one, so a run is reproducible under a seed, but its numbers are not the ones eager code
draws (Inductor's `fallback_random`, which would draw those, fails inside a scan in torch
2.13). Where the model cannot be built, a warning says so and the rollout runs eagerly; a
state whose tensors changed layout runs eagerly too.
"""
from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDict
from torch._higher_order_ops.scan import scan

from fnrl.accel import aot
from fnrl.envs.functional import FunctionalEnv
from fnrl.errors import ConfigError
from fnrl.samplers.lane import STEP_KEYS, RolloutBuffer

OPTIONS: dict = {}
"""Inductor options of the rollout model."""


def check_supported(algo: str, module) -> None:
    """ConfigError, before any work, for a run the graph sampler cannot serve: one whose rollouts
    feed a sequence replay (R2D1); the envs it needs are checked by `fnrl.envs.functional.make`."""
    if module.SPEC.replay == "sequence":
        raise ConfigError(f"--sampler graph serves on-policy and row-replay algorithms; {algo} stores "
                          "sequences: use --sampler serial")


class GraphSampler:
    """Collect [T, B] rollouts of a functional env (`fnrl.envs.functional`) in one compiled call.

    env: a functional env (`reset(device) -> env state`, `step(env state, action)`, `spec`).
    act: `act(state, obs, carry, explore) -> (action, extras, carry)`, or an `fnrl.accel.aot.AotAct`
        of it (then compiled into the rollout). A policy whose first call returns a carry is
        recurrent (`fnrl.samplers.serial`'s protocol).
    The env state (the last observation, the physics, the episode counters) and a recurrent
    policy's carry and reset mask are kept between collects, as the serial sampler keeps them;
    `state_dict()` / `load_state_dict(...)` snapshot and restore them, so a checkpointed run
    resumes with every env mid-episode where it stood (`fnrl.train`'s `--resume`).
    """

    def __init__(self, env, act: Callable, horizon: int, device: str | torch.device = "cpu"):
        if not isinstance(env, FunctionalEnv):
            raise ConfigError("the graph sampler steps a functional env (fnrl.envs.functional.make), "
                              f"not {type(env).__name__}")
        self.env, self.horizon = env, horizon
        self.device = torch.device(device)
        self.compiled = isinstance(act, aot.AotAct)
        self.act = act.act if self.compiled else act
        self.keys = act.select if self.compiled else None
        self.env_state = TensorDict(env.reset(self.device), batch_size=[env.num_envs])
        self.buffer: RolloutBuffer | None = None
        self.policy: TensorDict | None = None   # recurrent: {"carry": [B] carry, "reset": [B] bool}
        self.model = None
        self._built = False

    @property
    def rollout(self) -> TensorDict | None:
        return None if self.buffer is None else self.buffer.rollout

    def _allocate(self, state: TensorDict) -> None:
        """The rollout buffer, from one step's shapes (random numbers drawn here are given back)."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            obs = self.env_state["obs"]
            action, extras, carry = self.act(state, obs, None, True)
            _, step = self.env.step(dict(self.env_state.items()), action)
        if carry is not None and self.policy is None:   # the first step starts every episode: zeroed anyway
            B = self.env.num_envs
            self.policy = TensorDict({"carry": carry.clone().zero_(),
                                      "reset": torch.ones(B, dtype=torch.bool, device=self.device)}, batch_size=[B])
        self.buffer = RolloutBuffer(self.horizon, self.env.num_envs, obs, action, extras,
                                    {k: step[k] for k in STEP_KEYS}, recurrent=carry is not None, device=self.device)

    def _rollout(self, state: TensorDict, env_state: TensorDict, buffers: TensorDict,
                 policy: TensorDict | None = None, explore: bool = True):
        """T steps of act + env.step as one scan; writes the rollout into `buffers` (obs [T + 1, B]
        and the [T, B] fields), the last env state into `env_state` and a recurrent policy's
        carry and reset mask into `policy`, in place.

        Recurrent: step t acts with carry["reset"] = reset_t, reset_{t+1} = not valid_t (the next
        observation starts an episode after the env's reset step); the rollout keeps reset_t and
        extras["carry"], the carry step t started from. The scan carries the policy's carry as a
        flat dict ("actor.h", ...)."""
        act, step, B = self.act, self.env.step, self.env.num_envs

        def body(carry: dict, _):
            env_carry = {k: v for k, v in carry.items() if not k.startswith(("policy.", "reset"))}
            if policy is None:
                action, extras, _ = act(state, env_carry["obs"], None, explore)
                after = {}
            else:
                core = TensorDict({k[len("policy."):]: v for k, v in carry.items() if k.startswith("policy.")},
                                  batch_size=[B]).unflatten_keys(".")
                core["reset"] = carry["reset"]
                action, extras, core = act(state, env_carry["obs"], core, explore)
                extras = dict(extras)
                started = extras.pop("carry").flatten_keys(".")
                extras.update({f"carry.{k}": v for k, v in started.items()})
                extras["reset"] = carry["reset"]
                after = {f"policy.{k}": v for k, v in core.flatten_keys(".").items()}
            env_carry, out = step(env_carry, action)
            if policy is not None:
                after["reset"] = ~out["valid"]
            # copies: scan results may alias neither each other nor the carry
            ys = {"action": action, **extras, **out}
            return {**env_carry, **after}, {k: v.clone() for k, v in ys.items()}

        start = {k: v for k, v in env_state.items()}
        if policy is not None:
            start.update({f"policy.{k}": v for k, v in policy["carry"].flatten_keys(".").items()},
                         reset=policy["reset"])
        last, ys = scan(body, start, torch.zeros(self.horizon, device=self.device))
        buffers["obs"][0].copy_(start["obs"])
        buffers["obs"][1:].copy_(ys.pop("obs"))
        for k, v in ys.items():
            buffers[tuple(k.split("."))].copy_(v)
        for k, v in last.items():
            if k.startswith("policy."):
                policy["carry"][tuple(k[len("policy."):].split("."))].copy_(v)
            elif k == "reset":
                policy["reset"].copy_(v)
            else:
                env_state[k].copy_(v)

    def _buffers(self) -> TensorDict:
        return TensorDict({"obs": self.buffer.obs, **self.buffer.fields}, batch_size=[])

    @torch.no_grad()
    def collect(self, state: TensorDict, explore: bool = True) -> TensorDict:
        """Step the env `horizon` times; return the (reused) rollout TensorDict [T, B]."""
        chosen = state if self.keys is None else state.select(*self.keys, strict=False)
        if self.buffer is None:
            self._allocate(chosen)
        args = (chosen, self.env_state, self._buffers()) + (() if self.policy is None else (self.policy,))
        if self.compiled and explore and not self._built and aot.serves(self.device):   # CUDA: eager scan
            self._built = True
            try:
                self.model = aot.AotFunction(self._rollout, args, OPTIONS)
            except Exception as e:   # noqa: BLE001 - whatever stops the build: the eager scan
                aot.warn_fallback("the graph sampler's rollout is", e, stacklevel=4, instead="collecting eagerly")
        if not (self.model is not None and explore and self.model.call_if_matches(*args)[0]):
            self._rollout(*args, explore=explore)
        return self.buffer.rollout

    def state_dict(self) -> TensorDict:
        """A copy of what the next collect starts from: `env` (the env state [B]) and, for a
        recurrent policy that has acted, `policy` (its carry and reset mask [B])."""
        out = TensorDict({"env": self.env_state}, batch_size=[self.env.num_envs])
        if self.policy is not None:
            out["policy"] = self.policy
        return out.clone().cpu()

    def load_state_dict(self, saved: TensorDict) -> None:
        """Continue from `state_dict()`'s snapshot; ConfigError if it is not one of these envs."""
        env_state = saved["env"]
        mine = self.env_state
        if (set(env_state.keys()) != set(mine.keys()) or env_state.batch_size != mine.batch_size
                or any(env_state[k].shape != v.shape or env_state[k].dtype != v.dtype for k, v in mine.items())):
            raise ConfigError(f"the checkpoint's env state (batch {list(env_state.batch_size)}, keys "
                              f"{sorted(env_state.keys())}) is not one of {self.env.num_envs} {self.env.env_id} "
                              "envs; resume with the env and --num-envs it was written with")
        mine.update_(env_state.to(self.device))
        if "policy" in saved.keys():
            self.policy = saved["policy"].to(self.device).clone()

    def close(self) -> None:
        """Nothing to release: the envs are tensors."""
