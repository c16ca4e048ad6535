"""R2D1: recurrent replay DQN (R2D2 of Kapturowski et al. 2019 without the distribution; rlpyt's R2D1).

- a dueling LSTM (or GRU) Q-network: torso (MLP / Nature CNN) -> recurrent core ->
  value and advantage streams (Wang et al. 2016), Q = V + A - mean_a A;
- sequence replay (`fnrl.replay.sequence`) of burn_in + seq_len + n_step rows, starting
  from the recurrent state the actor had at the first row ("stored state");
- burn-in: the first `burn_in` rows only warm the state up, without gradient;
- n-step double-Q targets under value rescaling h (Pohlen et al. 2018):
      y_t = h(R_t^(n) + gamma^m h^-1(Q_target(s_{t+m}, argmax_a Q(s_{t+m}, a)))),
  R_t^(n), gamma^m, m from `fnrl.returns.n_step_returns` (m < n at an episode end, and
  gamma^m = 0 after a termination); loss 0.5 (y_t - Q(s_t, a_t))^2, importance-weighted,
  averaged over the sequence `mask` (valid trained rows up to the first episode end);
- sequence priorities  p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t|, also given at
  insertion from the actor's own Q-values (`sequence_input`, rlpyt's input priorities).

    agent = r2d1.make(r2d1.Config(), env.spec)
    state = agent.init(seed=0)
    action, extras, carry = agent.act(state, obs, carry, explore=True)   # extras: q, carry
    state, metrics = agent.update(state, batch)     # batch: a sequence.sample TensorDict [L, N]

The training loop sees `SPEC.replay == "sequence"` and uses `fnrl.replay.sequence` with this
module's `sequence_input`. Defaults learn CartPole-v1; `experiments/r2d1_atari.py` holds
rlpyt's Atari settings (gamma 0.997, seq_len 80, burn-in 40, n 5, alpha 0.9, beta 0.6,
eta 0.9). The network sees the observation only (no previous action / reward inputs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from tensordict import TensorDict
from torch import nn

from fnrl import optim
from fnrl.algos.common import Agent, check_positive, gradient_step, initializing, masked_mean, require_discrete
from fnrl.algos.spec import AlgorithmSpec
from fnrl.algos.dqn import epsilon, target_update
from fnrl.distributions import epsilon_greedy
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets import call, parameters
from fnrl.nets.core import check_conv, encoder, mlp
from fnrl.nets.q import scale_gradient
from fnrl.nets.recurrent import make_core, reset_carry
from fnrl.returns import n_step_returns, signed_hyperbolic, signed_parabolic

SPEC = AlgorithmSpec(kind="off_policy", replay="sequence")


@dataclass
class Config:
    """R2D1 settings. Defaults learn CartPole-v1; `experiments/r2d1_atari.py` holds rlpyt's
    Atari settings."""

    env_id: str = "CartPole-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 150_000
    """total environment steps (all envs together)"""
    num_envs: int = 8
    """parallel environments B"""
    num_steps: int = 10
    """env steps per env between rounds of updates (rollout length)"""
    buffer_size: int = 80_000
    """replay capacity in env steps (all envs together)"""
    batch_size: int = 64
    """sequences per gradient update"""
    learning_starts: int = 2_000
    """env steps before the first update (epsilon starts to decay here)"""
    replay_ratio: float = 0.01
    """gradient updates per env step (each update trains batch_size * seq_len steps)"""
    burn_in: int = 8
    """rows per sequence that only warm the recurrent state up (no gradient)"""
    seq_len: int = 16
    """trained rows per sequence"""
    carry_interval: int = 8
    """rows between stored recurrent states = between sequence starts"""
    n_step: int = 3
    """n-step return length"""
    gamma: float = 0.99
    """discount factor"""
    value_rescale: bool = True
    """learn h(Q) with h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x (R2D2)"""
    rescale_eps: float = 1e-3
    """eps of the value rescaling h"""
    prioritized: bool = True
    """prioritized sequence replay"""
    priority_alpha: float = 0.9
    """priority exponent alpha"""
    priority_beta: float = 0.6
    """initial importance-weight exponent beta (annealed to 1 by the training loop)"""
    priority_eta: float = 0.9
    """sequence priority eta max|td| + (1 - eta) mean|td|"""
    input_priorities: bool = True
    """give new sequences priorities from the actor's Q-values (else the max priority)"""
    learning_rate: float = 1e-3
    """Adam step size"""
    optimizer_eps: float = 1e-3
    """Adam epsilon (R2D2: 1e-3)"""
    max_grad_norm: float = 80.0
    """global gradient-norm clip (0 disables)"""
    target_update_interval: int = 100
    """gradient updates between target-network updates"""
    tau: float = 1.0
    """target update weight: 1 copies the online network, < 1 is a Polyak average"""
    eps_init: float = 1.0
    """initial exploration epsilon"""
    eps_final: float = 0.05
    """final exploration epsilon (the largest final epsilon with eps_final_min)"""
    eps_final_min: float | None = None
    """if set, final epsilons are log-spaced over the envs from eps_final_min to eps_final (rlpyt)"""
    eps_steps: int = 30_000
    """env step at which epsilon reaches its final value (linear from learning_starts)"""
    eps_eval: float = 0.0
    """epsilon of evaluation (explore=False) actions"""
    core: str = "lstm"
    """recurrent core: lstm or gru"""
    core_size: int = 64
    """recurrent state size"""
    hidden: tuple[int, ...] = (64,)
    """MLP torso sizes (vector observations)"""
    head_hidden: int = 64
    """hidden size of the value and advantage streams"""
    conv: str = "nature"
    """torso: nature or a3c (conv, for image observations), or your own torso factory as module:name
    (any tensor observation; `fnrl.nets.core.user_torso`)"""


VARIANTS: dict[str, dict] = {"r2d1": {}}
"""Command-line name -> Config overrides (Atari: experiments/r2d1_atari.py)."""


def validate(config: Config, spec: EnvSpec | None = None) -> None:
    """Raise ConfigError for settings that cannot work, before any training."""
    check_positive(config, "total_steps", "num_envs", "num_steps", "buffer_size", "batch_size", "replay_ratio",
                   "seq_len", "carry_interval", "n_step", "learning_rate", "optimizer_eps",
                   "target_update_interval", "tau", "core_size", "head_hidden")
    if config.burn_in < 0:
        raise ConfigError(f"--burn-in must be >= 0, got {config.burn_in}")
    if config.core not in ("lstm", "gru"):
        raise ConfigError(f"--core must be lstm or gru, got {config.core!r}")
    check_conv(config.conv)
    if not 0.0 < config.gamma <= 1.0 or config.tau > 1.0:
        raise ConfigError(f"need --gamma in (0, 1] and --tau in (0, 1], got {config.gamma}, {config.tau}")
    if not 0.0 <= config.priority_eta <= 1.0:
        raise ConfigError(f"--priority-eta must be in [0, 1], got {config.priority_eta}")
    if config.prioritized and not (config.priority_alpha >= 0 and 0 <= config.priority_beta <= 1):
        raise ConfigError(f"prioritized replay needs --priority-alpha >= 0 and --priority-beta in [0, 1], got "
                          f"{config.priority_alpha}, {config.priority_beta}")
    for name in ("eps_init", "eps_final", "eps_eval"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(config, name)}")
    rows = replay_rows_per_env(config)
    need = config.burn_in + config.seq_len + config.n_step + max(config.num_steps, config.carry_interval) + 3
    if rows < need:
        raise ConfigError(f"the replay keeps {rows} steps per env (--buffer-size {config.buffer_size} / --num-envs "
                          f"{config.num_envs}, rounded down to a multiple of --carry-interval), fewer than a "
                          f"sequence (burn-in + seq-len + n-step) plus a rollout ({need}); raise --buffer-size")
    if spec is not None:
        require_discrete("r2d1", spec)


def replay_rows_per_env(config: Config) -> int:
    """Rows per env of the sequence replay: buffer_size / num_envs rounded down to a multiple of k."""
    return config.buffer_size // config.num_envs // config.carry_interval * config.carry_interval


# ---------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------


class R2D1Network(nn.Module):
    """Torso -> recurrent core -> dueling head, unrolled over time.

    forward(obs [T, B, *obs], reset [T, B] bool, carry [B]) -> (q [T, B, A], carry).
    Vector observations go through an MLP of `hidden` sizes (ReLU), [C, H, W] images
    through the `conv` torso (Nature CNN: conv stack + fc 512, as rlpyt's R2D1 model).
    The head has a value and an advantage stream of `head_hidden` units each; the
    gradient into the core is scaled by 1/sqrt(2) (Wang et al. 2016, rlpyt).
    """

    def __init__(self, obs_shape, num_actions: int, core: str = "lstm", core_size: int = 64, hidden=(64,),
                 head_hidden: int = 64, conv="nature"):
        super().__init__()
        image = encoder(obs_shape, conv)
        if image is None:
            d = int(torch.Size(obs_shape).numel())
            self.torso = mlp(d, None, hidden, "relu")
            width = hidden[-1] if hidden else d
        else:
            self.torso, width = image
        self.obs_ndim, self.flatten_obs = len(obs_shape), image is None
        self.core = make_core(core, width, core_size)
        self.value = mlp(core_size, 1, (head_hidden,), "relu")
        self.advantage = mlp(core_size, num_actions, (head_hidden,), "relu")

    def initial_carry(self, batch_shape, device=None) -> TensorDict:
        return self.core.initial_carry(batch_shape, device=device)

    def forward(self, obs, reset, carry):
        x = obs.flatten(-self.obs_ndim).float() if self.flatten_obs else obs
        y, carry = self.core(self.torso(x), reset, carry)
        y = scale_gradient(y, 2 ** -0.5)
        advantage = self.advantage(y)
        return self.value(y) + advantage - advantage.mean(-1, keepdim=True), carry


# ---------------------------------------------------------------------------
# targets, loss, priorities
# ---------------------------------------------------------------------------


class Functions(NamedTuple):
    """The pure pieces `make` assembles (exposed for tests).

    net: the R2D1Network. q_sequence(params, batch) -> q [seq_len + n_step, N, A] of the
    rows after the burn-in, unrolled from the stored carry (burn-in without gradient).
    loss(params, target_params, batch) -> (loss, metrics) with `metrics["td_abs"]` [T, N]
    (masked |delta|) and `metrics["priority"]` [N].
    """

    net: R2D1Network
    q_sequence: Callable
    loss: Callable


def sequence_priority(td_abs: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's sequence priority p = eta max_t |delta_t| + (1 - eta) mean_t |delta_t| over masked rows.

    td_abs: [T, N] |TD errors|; mask: [T, N] bool. Returns [N] (0 for an all-masked sequence).
    """
    td_abs = td_abs * mask
    mean = td_abs.sum(0) / mask.sum(0).clamp(min=1)
    return eta * td_abs.amax(0) + (1.0 - eta) * mean


def n_step_double_q_targets(q_online: torch.Tensor, q_target: torch.Tensor, reward: torch.Tensor,
                            terminated: torch.Tensor, done: torch.Tensor, gamma: float, n: int, num_targets: int,
                            rescale: Callable, rescale_inv: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """n-step double-Q targets of the first `num_targets` rows of a sequence, under value rescaling h.

        y_t = h(R_t + gamma_t^m h^-1(Q_target[t + m, argmax_a Q_online[t + m, a]]))

    with R_t, gamma_t^m (0 after a termination) and m (<= n, shorter at an episode end)
    from `n_step_returns(reward, gamma (1 - terminated), done, n)`. Row t + m holds the
    observation after step t + m - 1 (the final observation on a done step).
    q_online, q_target: [T', N, A]; reward: [T', N] float; terminated, done: [T', N] bool.
    Returns (targets [num_targets, N] without gradient, bootstrap row t + m [num_targets, N]);
    a bootstrap row past the sequence (t + m >= T') is clamped to its last row, so such
    targets are wrong and must be masked (they never occur when T' >= num_targets + n).
    """
    discount = gamma * (~terminated).to(reward.dtype)
    returns, bootstrap_discount, offset = n_step_returns(reward, discount, done, n)
    row = torch.arange(num_targets, device=reward.device).unsqueeze(1) + offset[:num_targets]      # [T, N]
    best_row = row.clamp(max=q_target.shape[0] - 1)
    best = q_online.argmax(-1).gather(0, best_row)                                                  # [T, N]
    q_boot = q_target.gather(0, best_row.unsqueeze(-1).expand(-1, -1, q_target.shape[-1]))
    q_boot = q_boot.gather(-1, best.unsqueeze(-1)).squeeze(-1)
    target = returns[:num_targets] + bootstrap_discount[:num_targets] * rescale_inv(q_boot)
    return rescale(target).detach(), row


def _rescaling(config: Config):
    if not config.value_rescale:
        return (lambda x: x), (lambda x: x)
    eps = config.rescale_eps
    return (lambda x: signed_hyperbolic(x, eps)), (lambda x: signed_parabolic(x, eps))


def functions(config: Config, spec: EnvSpec, network=None) -> Functions:
    """Build the network (with the torso `network` in place of `config.conv`'s when given) and
    its pure sequence-Q and loss functions for `config`."""
    net = R2D1Network(spec.obs_shape, spec.num_actions, config.core, config.core_size, config.hidden,
                      config.head_hidden, config.conv if network is None else network)
    burn, T, n = config.burn_in, config.seq_len, config.n_step
    rescale, rescale_inv = _rescaling(config)

    def q_sequence(params, batch):
        obs, reset, carry = batch["obs"], batch["reset"], batch["carry"][0]
        if burn > 0:
            _, carry = call(net, params.detach(), obs[:burn], reset[:burn], carry)
            carry = carry.detach()
        q, _ = call(net, params, obs[burn:], reset[burn:], carry)
        return q

    def loss(params, target_params, batch):
        q = q_sequence(params, batch)                                                # [T + n, N, A]
        q_target = q_sequence(target_params, batch).detach()
        rows = batch[burn:]
        target, _ = n_step_double_q_targets(q.detach(), q_target, rows["reward"], rows["terminated"], rows["done"],
                                         config.gamma, n, T, rescale, rescale_inv)
        q_taken = q[:T].gather(-1, rows["action"][:T].unsqueeze(-1)).squeeze(-1)
        td = target - q_taken
        mask = rows["mask"][:T]
        total = masked_mean(0.5 * td.square() * batch["weight"][0], mask)
        td_abs = (td.detach().abs() * mask)
        return total, {"q_mean": masked_mean(q_taken.detach(), mask), "td_abs": td_abs,
                       "priority": sequence_priority(td_abs, mask, config.priority_eta)}

    return Functions(net, q_sequence, loss)


def sequence_input(config: Config, rollout: TensorDict) -> tuple[TensorDict, torch.Tensor | None]:
    """What the training loop adds to the sequence replay: (rows to store, priority [B] or None).

    The stored rows drop the actor's `q`. The input priority of every sequence starting in
    the rollout follows rlpyt's R2D1: n-step targets from the actor's own Q-values,
        delta_t = |Q(s_t, a_t) - h(R_t + gamma^m h^-1(max_a Q(s_{t+m}, a)))|,
    over the valid rows whose bootstrap row t + m lies inside the rollout, reduced to
    eta max + (1 - eta) mean per env. None when `input_priorities` or `prioritized` is off.
    """
    data = rollout.exclude("q")
    if not (config.prioritized and config.input_priorities):
        return data, None
    rescale, rescale_inv = _rescaling(config)
    q = rollout["q"]
    T = q.shape[0]
    target, row = n_step_double_q_targets(q, q, rollout["reward"], rollout["terminated"], rollout["done"],
                                          config.gamma, config.n_step, T, rescale, rescale_inv)
    inside = row < T                          # the others bootstrap past the rollout: masked out
    q_taken = q.gather(-1, rollout["action"].unsqueeze(-1)).squeeze(-1)
    td_abs = (target - q_taken).abs()
    return data, sequence_priority(td_abs, rollout["valid"] & inside, config.priority_eta)


# ---------------------------------------------------------------------------
# the agent
# ---------------------------------------------------------------------------


def make(config: Config, spec: EnvSpec, network=None) -> Agent:
    """Bind R2D1 to an environment: returns `Agent(init, act, update)` of pure functions.

    network: a torso of your own in place of the built-in one (an nn.Module, a factory
        `factory(obs_shape) -> (module, out_dim)`, or "module:name"; `fnrl.nets.core.user_torso`),
        the heads on top; default: `config.conv`'s.
    """
    validate(config, spec)
    fns = functions(config, spec, network)
    opt = optim.adam(config.learning_rate, eps=config.optimizer_eps)
    if config.max_grad_norm > 0:
        opt = optim.chain(optim.clip_by_global_norm(config.max_grad_norm), opt)

    def init(seed: int) -> TensorDict:
        with initializing(seed):
            params = parameters(functions(config, spec, network).net)
        return TensorDict({
            "params": params,
            "target_params": params.clone(),
            "opt_state": opt.init(params),
            "env_steps": torch.zeros((), dtype=torch.int64),
            "updates": torch.zeros((), dtype=torch.int64),
        }, batch_size=[])

    def act(state, obs, carry, explore: bool = True):
        """One step: carry None (first call) starts from zeros; carry["reset"] zeroes envs first.
        extras: `q` [B, A] and `carry`, the carry the step started from (after its reset)."""
        B = obs.shape[0]
        if carry is None:
            carry = fns.net.initial_carry([B], device=obs.device)
        elif "reset" in carry.keys():
            carry = reset_carry(carry.exclude("reset"), carry["reset"])
        no_reset = torch.zeros(1, B, dtype=torch.bool, device=obs.device)
        q, new_carry = call(fns.net, state["params"], obs.unsqueeze(0), no_reset, carry)
        q = q.squeeze(0)
        eps = epsilon(config, state["env_steps"], B) if explore else config.eps_eval
        return epsilon_greedy(q, eps), {"q": q, "carry": carry}, new_carry

    def update(state: TensorDict, batch: TensorDict):
        params, opt_state, metrics = gradient_step(fns.loss, state["params"], opt, state["opt_state"],
                                                   state["target_params"], batch)
        updates = state["updates"] + 1
        new_state = state.copy()
        new_state["params"], new_state["opt_state"], new_state["updates"] = params, opt_state, updates
        new_state["target_params"] = target_update(config, state["target_params"], params, updates)
        td_abs = metrics.pop("td_abs")
        priority = metrics.pop("priority")
        metrics["loss/q"] = metrics.pop("loss")
        metrics["td_abs_mean"] = td_abs.sum() / batch["mask"].sum().clamp(min=1)
        metrics["epsilon"] = epsilon(config, state["env_steps"], config.num_envs).mean()
        if config.prioritized:
            metrics["priority"] = priority
        return new_state, TensorDict(metrics, batch_size=[])

    return Agent(init=init, act=act, update=update)
