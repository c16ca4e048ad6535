"""Environments as pure torch functions, for rollouts compiled together with the policy.

purejaxrl's speed comes from the environment living inside the same compiled program as
the policy: a whole [T, B] rollout is one call, with no Python, no thread hand-off and no
numpy conversion per step. This module gives fnrl that option for the classic-control
tasks whose dynamics are a few elementwise ops. An env here is a pair of pure functions
over a dict of [B] tensors (its state):

    env = functional.make("CartPole-v1", num_envs=64, seed=0)
    state = env.reset()                             # {"obs": [B, 4], "physics": [B, 4], ...}
    state, step = env.step(state, action)           # action [B] int64
    step["obs"], step["reward"], step["valid"], ...  # the step keys of fnrl.envs.batched

`step` draws the reset states it needs from torch's global generator, so it traces into a
`scan` and compiles (`fnrl.samplers.graph`). It keeps fnrl's step contract exactly
(`fnrl.envs.batched`): next-step autoreset (the step after a done step returns the reset
observation with reward 0, `valid=False`, and ignores the action), `terminated` and
`truncated` (the time limit, never both), `episode_end` / `episode_return` /
`episode_length` on the step an episode ends. The dynamics are gymnasium's, computed in
float64 as gymnasium does and observed in float32 (`tests/test_functional_envs.py`
steps both side by side); the random initial states differ from EnvPool's and gymnasium's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class CartPole:
    """gymnasium's CartPole-v1 (Barto, Sutton & Anderson 1983) for `num_envs` envs.

    Physics [B, 4] float64 = (x, x_dot, theta, theta_dot); Euler steps of tau = 0.02 s with a
    force of +-10 N (action 1 pushes right). The episode terminates when |x| > 2.4 or
    |theta| > 12 degrees and is truncated after 500 steps; every step before the reset earns 1.
    Reset states are uniform in [-0.05, 0.05]^4."""

    num_envs: int
    seed: int | None = None
    max_episode_steps: int = 500

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    length = 0.5   # half the pole's length
    force_mag = 10.0
    tau = 0.02
    x_threshold = 2.4
    theta_threshold = 12 * 2 * math.pi / 360

    @property
    def spec(self) -> EnvSpec:
        return EnvSpec(env_id="CartPole-v1", num_envs=self.num_envs, obs_shape=(4,), obs_dtype=torch.float32,
                       action_shape=(), action_dtype=torch.int64, num_actions=2,
                       max_episode_steps=self.max_episode_steps)

    def _initial(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(like.shape, dtype=torch.float64, device=like.device, generator=generator)
        return u * 0.1 - 0.05

    def dynamics(self, physics: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """One Euler step of gymnasium's equations: [B, 4] float64, [B] -> [B, 4]."""
        x, x_dot, theta, theta_dot = physics.unbind(-1)
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * self.length
        force = torch.where(action == 1, self.force_mag, -self.force_mag).to(physics.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + polemass_length * theta_dot.square() * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos.square() / total_mass))
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        return torch.stack([x + self.tau * x_dot, x_dot + self.tau * x_acc,
                            theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc], dim=-1)

    def reset(self, device="cpu") -> State:
        """Every env at a fresh initial state (drawn with `seed`'s generator where one is set)."""
        B = self.num_envs
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        physics = self._initial(torch.empty(B, 4, dtype=torch.float64), generator).to(device)
        zeros = torch.zeros(B, device=device)
        return {"obs": physics.float(), "physics": physics, "elapsed": zeros.clone(),
                "ended": torch.zeros(B, dtype=torch.bool, device=device), "ep_return": zeros.clone(),
                "ep_length": zeros.clone()}

    def step(self, state: State, action: torch.Tensor) -> tuple[State, State]:
        """All envs one step: (the next state, the step's [B] tensors; keys in fnrl.envs.batched).

        With `ended` the previous step's `done` (the envs that reset on this step):

            physics' = initial  where ended,  dynamics(physics, action) elsewhere
            valid = not ended,   reward = valid,   elapsed' = valid (elapsed + 1)
            terminated = valid and out of bounds(physics'),   truncated = valid and elapsed' >= 500, not terminated
            R' = R [not ended] + reward,   episode_return = R' [done]   (and the length likewise)"""
        ended = state["ended"]
        valid = ~ended
        physics = torch.where(ended[:, None], self._initial(state["physics"]),
                              self.dynamics(state["physics"], action))
        x, theta = physics[:, 0], physics[:, 2]
        out_of_bounds = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        reward = valid.float()
        elapsed = torch.where(valid, state["elapsed"] + 1, 0.0)
        terminated = valid & out_of_bounds
        truncated = valid & (elapsed >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        ep_return = torch.where(valid, state["ep_return"] + reward, 0.0)
        ep_length = torch.where(valid, state["ep_length"] + 1, 0.0)
        obs = physics.float()
        step = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, "done": done,
                "valid": valid, "episode_end": done, "episode_return": ep_return * done,
                "episode_length": ep_length * done}
        return ({"obs": obs, "physics": physics, "elapsed": elapsed, "ended": done, "ep_return": ep_return,
                 "ep_length": ep_length}, step)


ENVS = {"CartPole-v1": CartPole}
"""Env ids with a functional form: id -> class `(num_envs, seed)`."""


def available() -> list[str]:
    return list(ENVS)


def make(env_id: str, num_envs: int, seed: int | None = None):
    """The functional form of `env_id`; ConfigError naming the ids that have one."""
    if env_id not in ENVS:
        raise ConfigError(f"{env_id!r} has no torch version for --sampler graph; it has one for: "
                          f"{', '.join(ENVS)} (or use --sampler serial)")
    return ENVS[env_id](num_envs, seed)
