"""Environments as pure torch functions, for rollouts compiled together with the policy.

purejaxrl's speed comes from the environment living inside the same compiled program as
the policy: a whole [T, B] rollout is one call, with no Python, no thread hand-off and no
numpy conversion per step. This module gives fnrl that option for the classic-control
tasks whose dynamics are a few elementwise ops (CartPole-v1, Acrobot-v1, Pendulum-v1,
MountainCar-v0, MountainCarContinuous-v0, and fnrl's partially observed fnrl/CartPoleNoVel-v1).
An env here is a pair of pure functions over a dict of [B] tensors (its state):

    env = functional.make("CartPole-v1", num_envs=64, seed=0)
    state = env.reset()                             # {"obs": [B, 4], "physics": [B, 4], ...}
    state, step = env.step(state, action)           # action [B] int64
    step["obs"], step["reward"], step["valid"], ...  # the step keys of fnrl.envs.batched

`step` draws the reset states it needs from torch's global generator, so it traces into a
`scan` and compiles (`fnrl.samplers.graph`). It keeps fnrl's step contract exactly
(`fnrl.envs.batched`): next-step autoreset (the step after a done step returns the reset
observation with reward 0, `valid=False`, and ignores the action), `terminated` and
`truncated` (the time limit; never both: an episode that terminates on its last
allowed step is terminated, where gymnasium's TimeLimit reports both), `episode_end` / `episode_return` /
`episode_length` on the step an episode ends. The dynamics are gymnasium's, computed in
float64 as gymnasium does (float32 for MountainCarContinuous, whose state gymnasium keeps in
float32) and observed in float32 (`tests/test_functional_envs.py`
steps both side by side); the random initial states differ from EnvPool's and gymnasium's.
"""
from __future__ import annotations

import math

import torch

from fnrl.envs import FNRL_ENVS
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError

State = dict[str, torch.Tensor]


class FunctionalEnv:
    """`num_envs` envs of one task as pure functions over a dict of [B] tensors (the env state).

    A task gives its physics (a [B, P] tensor, float64 but where gymnasium keeps float32,
    `physics_size` = P) through three methods:

        initial(like, generator) -> physics          # fresh episode starts, shaped like `like`
        transition(physics, action) -> (physics', reward [B] float64, terminal [B] bool)
        observe(physics) -> obs [B, *obs] float32

    and its spaces (`env_id`, `obs_size`; `num_actions` for discrete actions, else one
    action in [-`max_action`, `max_action`]); this class adds fnrl's step contract around them
    (`step`) and the `spec`."""

    env_id: str
    physics_size: int
    obs_size: int
    num_actions: int | None = None
    max_action: float | None = None
    max_episode_steps: int

    def __init__(self, num_envs: int, seed: int | None = None, max_episode_steps: int | None = None):
        self.num_envs, self.seed = num_envs, seed
        if max_episode_steps is not None:
            self.max_episode_steps = max_episode_steps

    @property
    def spec(self) -> EnvSpec:
        if self.num_actions is not None:
            actions = dict(action_shape=(), action_dtype=torch.int64, num_actions=self.num_actions)
        else:
            bound = torch.tensor([self.max_action])
            actions = dict(action_shape=(1,), action_dtype=torch.float32, action_low=-bound, action_high=bound)
        return EnvSpec(env_id=self.env_id, num_envs=self.num_envs, obs_shape=(self.obs_size,),
                       obs_dtype=torch.float32, max_episode_steps=self.max_episode_steps, **actions)

    def reset(self, device="cpu") -> State:
        """Every env at a fresh initial state (drawn with `seed`'s generator where one is set)."""
        B = self.num_envs
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        physics = self.initial(torch.empty(B, self.physics_size, dtype=torch.float64), generator).to(device)
        zeros = torch.zeros(B, device=device)
        return {"obs": self.observe(physics), "physics": physics, "elapsed": zeros.clone(),
                "ended": torch.zeros(B, dtype=torch.bool, device=device),
                "ep_return": torch.zeros(B, dtype=torch.float64, device=device), "ep_length": zeros.clone()}

    def step(self, state: State, action: torch.Tensor) -> tuple[State, State]:
        """All envs one step: (the next state, the step's [B] tensors; keys in fnrl.envs.batched).

        With `ended` the previous step's `done` (the envs that reset on this step):

            physics', r, terminal = initial, 0, False  where ended,  transition(physics, action) elsewhere
            valid = not ended,   elapsed' = valid (elapsed + 1)
            terminated = valid and terminal,   truncated = valid and elapsed' >= max_episode_steps, not terminated
            R' = valid (R + r),   episode_return = R' [done]   (the length likewise, counting valid steps)"""
        ended = state["ended"]
        valid = ~ended
        moved, reward, terminal = self.transition(state["physics"], action)
        B, P = moved.shape
        # mixed over the flat [B * P] elements: Inductor then draws one random number per element,
        # where a [B, P] loop vectorized along P's few columns draws a whole vector's worth each
        physics = torch.where(ended.repeat_interleave(P), self.initial(state["physics"]).flatten(),
                              moved.flatten()).view(B, P)
        reward = torch.where(valid, reward, 0.0).float()
        elapsed = torch.where(valid, state["elapsed"] + 1, 0.0)
        terminated = valid & terminal
        truncated = valid & (elapsed >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        ep_return = torch.where(valid, state["ep_return"] + reward.double(), 0.0)   # summed as fnrl.envs.batched sums
        ep_length = torch.where(valid, state["ep_length"] + 1, 0.0)
        obs = self.observe(physics)
        step = {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, "done": done,
                "valid": valid, "episode_end": done, "episode_return": (ep_return * done).float(),
                "episode_length": ep_length * done}
        return ({"obs": obs, "physics": physics, "elapsed": elapsed, "ended": done, "ep_return": ep_return,
                 "ep_length": ep_length}, step)


def _uniform(like: torch.Tensor, high: float, generator=None) -> torch.Tensor:
    """Uniform in [-high, high], shaped like `like` (float64; from `generator` where one is given,
    else from torch's global generator, as a traced step draws)."""
    if generator is None:
        u = torch.rand_like(like, dtype=torch.float64)
    else:
        u = torch.rand(like.shape, dtype=torch.float64, device=like.device, generator=generator)
    return (2 * u - 1) * high


class CartPole(FunctionalEnv):
    """gymnasium's CartPole-v1 (Barto, Sutton & Anderson 1983).

    Physics [B, 4] = (x, x_dot, theta, theta_dot); Euler steps of tau = 0.02 s with a force of
    +-10 N (action 1 pushes right). The episode terminates when |x| > 2.4 or |theta| > 12
    degrees and is truncated after 500 steps; every step before the reset earns 1. Initial
    states are uniform in [-0.05, 0.05]^4."""

    env_id, physics_size, obs_size, num_actions = "CartPole-v1", 4, 4, 2
    max_episode_steps = 500
    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    length = 0.5   # half the pole's length
    force_mag = 10.0
    tau = 0.02
    x_threshold = 2.4
    theta_threshold = 12 * 2 * math.pi / 360

    def initial(self, like, generator=None):
        return _uniform(like, 0.05, generator)

    def observe(self, physics):
        return physics.float()

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

    def transition(self, physics, action):
        moved = self.dynamics(physics, action)
        out = (moved[:, 0].abs() > self.x_threshold) | (moved[:, 2].abs() > self.theta_threshold)
        return moved, torch.ones_like(moved[:, 0]), out


class Pendulum(FunctionalEnv):
    """gymnasium's Pendulum-v1: swing a pendulum up with a torque in [-2, 2].

    Physics [B, 2] = (theta, theta_dot), theta 0 upright; observations (cos theta, sin theta,
    theta_dot). Per step of dt = 0.05 s, with the torque u clipped to [-2, 2]:

        reward = -(normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)
        theta_dot' = clip(theta_dot + (3 g / 2 l sin theta + 3 / (m l^2) u) dt, -8, 8),  theta' = theta + theta_dot' dt

    (g = 10, m = l = 1). It never terminates and is truncated after 200 steps; initial states
    are uniform in [-pi, pi] x [-1, 1]."""

    env_id, physics_size, obs_size, max_action = "Pendulum-v1", 2, 3, 2.0   # the torque bound
    max_episode_steps = 200
    g, m, l, dt = 10.0, 1.0, 1.0, 0.05
    max_speed = 8.0

    def initial(self, like, generator=None):
        u = _uniform(like, 1.0, generator)
        return torch.stack([u[:, 0] * math.pi, u[:, 1]], dim=-1)

    def observe(self, physics):
        theta, theta_dot = physics.unbind(-1)
        return torch.stack([torch.cos(theta), torch.sin(theta), theta_dot], dim=-1).float()

    def transition(self, physics, action):
        theta, theta_dot = physics.unbind(-1)
        u = action[:, 0].to(physics.dtype).clamp(-self.max_action, self.max_action)
        normalized = torch.remainder(theta + math.pi, 2 * math.pi) - math.pi
        cost = normalized.square() + 0.1 * theta_dot.square() + 0.001 * u.square()
        accel = 3 * self.g / (2 * self.l) * torch.sin(theta) + 3.0 / (self.m * self.l ** 2) * u
        theta_dot = (theta_dot + accel * self.dt).clamp(-self.max_speed, self.max_speed)
        moved = torch.stack([theta + theta_dot * self.dt, theta_dot], dim=-1)
        return moved, -cost, torch.zeros_like(theta, dtype=torch.bool)


class _Valley(FunctionalEnv):
    """The mountain car's valley (Moore 1990), shared by MountainCar and its continuous version:
    physics [B, 2] = (position, velocity), initial positions uniform in [-0.6, -0.4] at rest, and

        velocity' = clip(velocity + push - 0.0025 cos(3 position), -0.07, 0.07)
        position' = clip(position + velocity', -1.2, 0.6),   velocity' = 0 where position' = -1.2 and velocity' < 0

    with the goal reached at position' >= `goal_position` and velocity' >= 0."""

    physics_size = obs_size = 2
    gravity, max_speed, min_position, max_position = 0.0025, 0.07, -1.2, 0.6
    goal_position: float
    physics_dtype = torch.float64

    def initial(self, like, generator=None):
        u = _uniform(like, 1.0, generator)
        return torch.stack([-0.5 + 0.1 * u[:, 0], torch.zeros_like(u[:, 1])], dim=-1).to(self.physics_dtype)

    def observe(self, physics):
        return physics.to(torch.float32, copy=True)   # a copy even of float32 physics: a scan's carry aliases nothing

    def roll(self, position, velocity):
        """(physics' [B, 2], goal reached [B]) from the position and the velocity after its push and pull."""
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        return torch.stack([position, velocity], dim=-1), (position >= self.goal_position) & (velocity >= 0)


class MountainCar(_Valley):
    """gymnasium's MountainCar-v0: drive an underpowered car up the right hill (`_Valley`).

    Actions 0 / 1 / 2 push left / not / right: push = (action - 1) 0.001. Every step earns -1;
    the episode terminates at position >= 0.5 and is truncated after 200 steps."""

    env_id, num_actions = "MountainCar-v0", 3
    max_episode_steps = 200
    force, goal_position = 0.001, 0.5

    def transition(self, physics, action):
        position, velocity = physics.unbind(-1)
        velocity = velocity + ((action.to(physics.dtype) - 1) * self.force + torch.cos(3 * position) * -self.gravity)
        physics, reached = self.roll(position, velocity)
        return physics, torch.full_like(position, -1.0), reached


class MountainCarContinuous(_Valley):
    """gymnasium's MountainCarContinuous-v0: the valley (`_Valley`) with a force in [-1, 1] and an
    energy cost: push = clip(a, -1, 1) 0.0015 and

        reward = 100 [goal reached] - 0.1 a^2        (a unclipped)

    The episode terminates at the goal (position >= 0.45) and is truncated after 999 steps. The
    physics are float32, as gymnasium keeps its state, and so is its step's arithmetic but for
    the cosine, taken in float64."""

    env_id, max_action = "MountainCarContinuous-v0", 1.0
    max_episode_steps = 999
    power, goal_position = 0.0015, 0.45
    physics_dtype = torch.float32

    def transition(self, physics, action):
        position, velocity = physics.unbind(-1)
        a = action[:, 0].float()
        slope = (torch.cos((3 * position).double()) * self.gravity).float()
        physics, reached = self.roll(position, velocity + (a.clamp(-self.max_action, self.max_action) * self.power
                                                           - slope))
        reward = torch.where(reached, 100.0, 0.0).double() - 0.1 * a.double().square()
        return physics, reward, reached


class Acrobot(FunctionalEnv):
    """gymnasium's Acrobot-v1 (Sutton 1996; the book's dynamics): swing a two-link arm's tip above
    the bar by torquing the joint between the links.

    Physics [B, 4] = (theta1, theta2, dtheta1, dtheta2); observations (cos theta1, sin theta1,
    cos theta2, sin theta2, dtheta1, dtheta2). Actions 0 / 1 / 2 apply a torque of -1 / 0 / 1;
    one step integrates the equations of motion over dt = 0.2 s with one Runge-Kutta-4 step,
    wraps the angles into [-pi, pi] and clips the velocities to 4 pi and 9 pi. The episode
    terminates once -cos theta1 - cos(theta1 + theta2) > 1 (reward 0 there, -1 on every other
    step) and is truncated after 500 steps. Initial states are uniform in [-0.1, 0.1]^4,
    rounded to float32 as gymnasium's are."""

    env_id, physics_size, obs_size, num_actions = "Acrobot-v1", 4, 6, 3
    max_episode_steps = 500
    dt, g = 0.2, 9.8
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5   # the links' centres of mass
    I1 = I2 = 1.0     # and moments of inertia
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi

    def initial(self, like, generator=None):
        return _uniform(like, 0.1, generator).float().double()

    def observe(self, physics):
        theta1, theta2, dtheta1, dtheta2 = physics.unbind(-1)
        return torch.stack([torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2),
                            dtheta1, dtheta2], dim=-1).float()

    def derivatives(self, s: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
        """d/dt of the physics [B, 4] under `torque` [B] (gymnasium's `_dsdt`, the book's form)."""
        m1, m2, l1, lc1, lc2, I1, I2, g = self.m1, self.m2, self.l1, self.lc1, self.lc2, self.I1, self.I2, self.g
        theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
        d1 = m1 * lc1 ** 2 + m2 * (l1 ** 2 + lc2 ** 2 + 2 * l1 * lc2 * torch.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2 ** 2 + l1 * lc2 * torch.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2 ** 2 * torch.sin(theta2)
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - math.pi / 2) + phi2)
        ddtheta2 = ((torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 ** 2 * torch.sin(theta2) - phi2)
                    / (m2 * lc2 ** 2 + I2 - d2 ** 2 / d1))
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], dim=-1)

    def transition(self, physics, action):
        torque = action.to(physics.dtype) - 1
        f, dt = self.derivatives, self.dt
        k1 = f(physics, torque)
        k2 = f(physics + dt / 2.0 * k1, torque)
        k3 = f(physics + dt / 2.0 * k2, torque)
        k4 = f(physics + dt * k3, torque)
        s = physics + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
        wrap = lambda x: torch.remainder(x + math.pi, 2 * math.pi) - math.pi   # noqa: E731
        moved = torch.stack([wrap(theta1), wrap(theta2), dtheta1.clamp(-self.max_vel_1, self.max_vel_1),
                             dtheta2.clamp(-self.max_vel_2, self.max_vel_2)], dim=-1)
        up = -torch.cos(moved[:, 0]) - torch.cos(moved[:, 1] + moved[:, 0]) > 1.0
        return moved, torch.where(up, 0.0, -1.0).to(physics.dtype), up


def _observing(env_id: str, base: type, index: tuple[int, ...]) -> type:
    """`base` observed through entries `index` of its observation only (an fnrl variant, e.g.
    fnrl/CartPoleNoVel-v1); the entries are picked by slices, as a traced scan creates no tensor."""

    class Variant(base):
        def observe(self, physics):
            obs = super().observe(physics)
            return torch.stack([obs[..., i] for i in index], dim=-1)

    Variant.env_id, Variant.obs_size = env_id, len(index)
    Variant.__name__ = Variant.__qualname__ = f"{base.__name__}Observing{''.join(map(str, index))}"
    return Variant


ENVS = {"CartPole-v1": CartPole, "Acrobot-v1": Acrobot, "Pendulum-v1": Pendulum,
        "MountainCar-v0": MountainCar, "MountainCarContinuous-v0": MountainCarContinuous}
ENVS.update({env_id: _observing(env_id, ENVS[base], index) for env_id, (base, index) in FNRL_ENVS.items()
             if base in ENVS})
"""Env ids with a functional form: id -> class `(num_envs, seed, max_episode_steps=None)`; the
fnrl variants of these tasks (`fnrl.envs.FNRL_ENVS`, e.g. the partially observed
fnrl/CartPoleNoVel-v1) included."""


def available() -> list[str]:
    return list(ENVS)


def make(env_id: str, num_envs: int, seed: int | None = None):
    """The functional form of `env_id`; ConfigError naming the ids that have one."""
    if env_id not in ENVS:
        raise ConfigError(f"{env_id!r} has no torch version for --sampler graph; it has one for: "
                          f"{', '.join(ENVS)} (or use --sampler serial)")
    return ENVS[env_id](num_envs, seed)
