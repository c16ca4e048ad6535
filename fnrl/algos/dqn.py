"""The DQN family as one algorithm with options (rlpyt's DQN line).

- DQN (Mnih et al. 2015): Huber loss on the one-step TD error, a target network copied
  every K updates, Adam or RMSprop, epsilon-greedy with a linear schedule;
- Double DQN (van Hasselt et al. 2016, arXiv:1509.06461): `double_q=True`;
- Dueling heads (Wang et al. 2016, arXiv:1511.06581): `dueling=True`;
- n-step returns and prioritized replay (Schaul et al. 2016): `n_step`, `prioritized`
  (the replay buffer computes the n-step return and bootstrap discount at sample time);
- Categorical DQN, C51 (Bellemare et al. 2017, arXiv:1707.06887): `head="categorical"`;
- "Rainbow minus noisy nets" (Hessel et al. 2018, arXiv:1710.02298): double + dueling +
  C51 + n-step + prioritized by the KL loss, rlpyt's "ernbw";
- QR-DQN (Dabney et al. 2018, arXiv:1710.10044): `head="quantile"`;
- IQN (Dabney et al. 2018, arXiv:1806.06923): `head="iqn"`.

    agent = dqn.make(dqn.Config(), env.spec)
    state = agent.init(seed=0)
    action, extras, carry = agent.act(state, obs, None, explore=True)
    state, metrics = agent.update(state, batch)     # one gradient update on a replay sample

The head decides what the network outputs per action ([*, A, K]: K = 1 Q-value, C51
logits over atoms, or quantiles) and which loss is used; everything else (target
network, double-Q action selection, importance weights, optimizer, target update,
priorities) is shared. `update` is pure and compiles with `torch.compile(fullgraph=True)`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from tensordict import TensorDict

from fnrl import losses, optim
from fnrl.algos.common import Agent, check_positive, gradient_step, initializing, require_discrete
from fnrl.algos.spec import AlgorithmSpec
from fnrl.distributions import epsilon_greedy
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets import call, parameters
from fnrl.nets.core import check_conv
from fnrl.nets.q import QNetwork
from fnrl.returns import n_step_returns

SWEEPABLE = ("learning_rate", "gamma")
"""Config fields `fnrl train dqn --sweep FIELD=v1,v2` may vary across the rows of one vmapped run:
the learning rate is held in the optimizer state (`optim.scale_by_stored_learning_rate`) and gamma
only in the replay (each row's buffer computes its own n-step returns), so one update serves all rows."""
ACT_KEYS = ("params", "env_steps")
"""The state `act` reads (the training loop passes a compiled `act` only these: fewer guards)."""
SPEC = AlgorithmSpec(kind="off_policy", replay="row", act_keys=ACT_KEYS, sweepable=SWEEPABLE)
HEADS = ("q", "categorical", "quantile", "iqn")


@dataclass
class Config:
    """DQN-family settings: one-step DQN with a soft target network (tau 0.01 after every update) on
    a 256-256 MLP. `VARIANTS` sets the other heads; the presets (`fnrl/presets`) hold the settings
    that learn each env on every seed (CartPole: 3-step double-DQN targets and a hard target copy),
    and `experiments/dqn_atari.py` rlpyt's Atari settings."""

    env_id: str = "CartPole-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 100_000
    """total environment steps (all envs together)"""
    num_envs: int = 4
    """parallel environments B"""
    num_steps: int = 4
    """env steps per env between rounds of updates (rollout length T)"""
    buffer_size: int = 50_000
    """replay capacity in env steps (all envs together)"""
    batch_size: int = 128
    """replay sample size per gradient update"""
    learning_starts: int = 1_000
    """env steps before the first update (epsilon starts to decay here, as in rlpyt)"""
    replay_ratio: float = 0.25
    """gradient updates per env step (0.25: one update every 4 env steps)"""
    n_step: int = 1
    """n-step return length"""
    gamma: float = 0.99
    """discount factor"""
    prioritized: bool = False
    """prioritized replay (Schaul et al. 2016)"""
    priority_alpha: float = 0.6
    """priority exponent alpha"""
    priority_beta: float = 0.4
    """initial importance-weight exponent beta (annealed to 1 by the training loop)"""
    optimizer: str = "adam"
    """adam or rmsprop"""
    learning_rate: float = 1e-3
    """optimizer step size"""
    anneal_lr: bool = False
    """decay the step size linearly to 0 over the run's updates ((total_steps - learning_starts) x replay_ratio)"""
    optimizer_eps: float = 1e-8
    """Adam / RMSprop epsilon (rlpyt: 0.01 / batch_size)"""
    rmsprop_alpha: float = 0.95
    """RMSprop squared-gradient decay"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip (0 disables)"""
    huber_delta: float = 1.0
    """Huber threshold of the TD loss ("q" head; 0 gives the squared loss) and kappa of the quantile loss"""
    target_update_interval: int = 1
    """gradient updates between target-network updates"""
    tau: float = 0.01
    """target update weight: 1 copies the online network, < 1 is a Polyak average"""
    double_q: bool = False
    """select the bootstrap action with the online network (double DQN)"""
    dueling: bool = False
    """dueling value/advantage head"""
    head: str = "q"
    """q, categorical (C51), quantile (QR-DQN) or iqn"""
    num_atoms: int = 51
    """categorical head: atoms of the support"""
    v_min: float = -10.0
    """categorical head: smallest return of the support"""
    v_max: float = 10.0
    """categorical head: largest return of the support"""
    num_quantiles: int = 200
    """quantile head: number of fixed quantile fractions"""
    num_tau_samples: int = 64
    """iqn: fractions tau sampled for the online distribution (N)"""
    num_tau_prime_samples: int = 64
    """iqn: fractions tau' sampled for the target distribution (N')"""
    num_quantile_samples: int = 32
    """iqn: fractions of the estimate of Q that chooses actions (K)"""
    act_fractions: str = "midpoints"
    """iqn: those K fractions: midpoints ((k + 1/2) / K, so the greedy policy is deterministic) or sampled
    (tau ~ U(0, 1) at every call, the paper's)"""
    cosine_dim: int = 64
    """iqn: cosine features of tau"""
    eps_init: float = 1.0
    """initial exploration epsilon"""
    eps_final: float = 0.05
    """final exploration epsilon (the largest final epsilon with eps_final_min)"""
    eps_final_min: float | None = None
    """if set, final epsilons are log-spaced over the envs from eps_final_min to eps_final (rlpyt's vector epsilon)"""
    eps_steps: int = 10_000
    """env step at which epsilon reaches its final value (linear from learning_starts)"""
    eps_eval: float = 0.0
    """epsilon of evaluation (explore=False) actions"""
    hidden: tuple[int, ...] = (256, 256)
    """MLP hidden sizes (vector observations)"""
    activation: str = "relu"
    """MLP activation: relu or tanh"""
    conv: str = "nature"
    """torso: nature or a3c (conv, for image observations), or your own torso factory as module:name
    (any tensor observation; `fnrl.nets.core.user_torso`)"""


VARIANTS: dict[str, dict] = {
    "dqn": {},
    "c51": dict(head="categorical", num_atoms=51, v_min=0.0, v_max=100.0),
    "rainbow": dict(head="categorical", num_atoms=51, v_min=0.0, v_max=100.0, double_q=True, dueling=True,
                    n_step=3, prioritized=True, priority_alpha=0.5, priority_beta=0.4),
    "qrdqn": dict(head="quantile", num_quantiles=50),
    "iqn": dict(head="iqn", num_tau_samples=16, num_tau_prime_samples=16, num_quantile_samples=8, hidden=(128, 128)),
}
"""Command-line name -> the head and its settings (`fnrl.algos.default_config`). Per-env tuning lives in
the presets (`fnrl/presets/VARIANT.toml`; Atari: experiments/dqn_atari.py). IQN uses 16 fractions per
side and a 128-128 torso: the paper's 64 fractions cost 8x the compute on CartPole. It chooses actions on
K = 8 midpoint fractions (`act_fractions`), so its greedy policy is deterministic."""

_NAMES = {"q": "dqn", "categorical": "c51", "quantile": "qrdqn", "iqn": "iqn"}


def validate(config: Config, spec: EnvSpec | None = None) -> None:
    """Raise ConfigError for settings that cannot work, before any training."""
    check_positive(config, "total_steps", "num_envs", "num_steps", "buffer_size", "batch_size", "replay_ratio",
                   "n_step", "learning_rate", "optimizer_eps", "target_update_interval", "tau", "num_atoms",
                   "num_quantiles", "num_tau_samples", "num_tau_prime_samples", "num_quantile_samples",
                   "cosine_dim")
    if config.head not in HEADS:
        raise ConfigError(f"--head must be one of {', '.join(HEADS)}, got {config.head!r}")
    if config.act_fractions not in ("midpoints", "sampled"):
        raise ConfigError(f"--act-fractions must be midpoints or sampled, got {config.act_fractions!r}")
    if config.optimizer not in ("adam", "rmsprop"):
        raise ConfigError(f"--optimizer must be adam or rmsprop, got {config.optimizer!r}")
    if config.activation not in ("relu", "tanh"):
        raise ConfigError(f"--activation must be relu or tanh, got {config.activation!r}")
    check_conv(config.conv)
    if config.buffer_size < config.batch_size:
        raise ConfigError(f"--buffer-size {config.buffer_size} is smaller than one batch "
                          f"(--batch-size {config.batch_size}); raise the buffer size or lower the batch size")
    rows = config.buffer_size // config.num_envs
    if rows < config.num_steps + config.n_step:
        raise ConfigError(f"the replay keeps {rows} steps per env (--buffer-size {config.buffer_size} / --num-envs "
                          f"{config.num_envs}), fewer than a rollout of --num-steps {config.num_steps} plus "
                          f"--n-step {config.n_step}; raise --buffer-size")
    if config.n_step > config.total_steps // config.num_envs:
        raise ConfigError(f"--n-step {config.n_step} is longer than the whole run of "
                          f"{config.total_steps // config.num_envs} steps per env; lower --n-step")
    if not 0.0 < config.gamma <= 1.0:
        raise ConfigError(f"--gamma must be in (0, 1], got {config.gamma}")
    if config.tau > 1.0:
        raise ConfigError(f"--tau must be in (0, 1], got {config.tau}")
    if config.huber_delta < 0 or (config.head != "q" and config.huber_delta == 0):
        raise ConfigError(f"--huber-delta must be >= 0 (> 0 for quantile heads), got {config.huber_delta}")
    if config.head == "categorical" and (config.num_atoms < 2 or config.v_min >= config.v_max):
        raise ConfigError(f"the categorical head needs --num-atoms >= 2 and --v-min < --v-max, got "
                          f"{config.num_atoms} atoms on [{config.v_min}, {config.v_max}]")
    for name in ("eps_init", "eps_final", "eps_eval"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(config, name)}")
    if config.eps_final_min is not None and not 0.0 < config.eps_final_min <= config.eps_final:
        raise ConfigError(f"--eps-final-min must be in (0, eps_final={config.eps_final}], got {config.eps_final_min}")
    if config.prioritized and not (config.priority_alpha >= 0 and 0 <= config.priority_beta <= 1):
        raise ConfigError(f"prioritized replay needs --priority-alpha >= 0 and --priority-beta in [0, 1], got "
                          f"{config.priority_alpha}, {config.priority_beta}")
    if spec is not None:
        require_discrete(_NAMES[config.head], spec)


# ---------------------------------------------------------------------------
# exploration
# ---------------------------------------------------------------------------


def final_epsilons(config: Config, num_envs: int) -> torch.Tensor:
    """Final epsilon of each env [B]: eps_final, or (with eps_final_min) log-spaced from
    eps_final_min to eps_final over the envs, as rlpyt's EpsilonGreedyAgent."""
    if config.eps_final_min is None:
        return torch.full((num_envs,), float(config.eps_final))
    return torch.logspace(math.log10(config.eps_final_min), math.log10(config.eps_final), num_envs)


def epsilon(config: Config, env_steps: torch.Tensor, num_envs: int) -> torch.Tensor:
    """Exploration epsilon of each env [B] at `env_steps` (a 0-d tensor).

    eps = eps_init + (eps_final_b - eps_init) * clamp((t - t0) / (t1 - t0), 0, 1),
    t0 = learning_starts, t1 = max(eps_steps, t0 + 1): rlpyt's ramp, which holds
    eps_init while the replay fills and reaches the final values at eps_steps.
    """
    t0 = config.learning_starts
    t1 = max(config.eps_steps, t0 + 1)
    progress = ((env_steps.to(torch.float32) - t0) / (t1 - t0)).clamp(0.0, 1.0)
    final = final_epsilons(config, num_envs).to(progress.device)
    return config.eps_init + (final - config.eps_init) * progress


# ---------------------------------------------------------------------------
# network outputs and the loss
# ---------------------------------------------------------------------------


def _at_action(x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """x[n, action[n], :]: per-action outputs [N, A, K] -> [N, K]."""
    index = action[:, None, None].expand(-1, 1, x.shape[-1])
    return x.gather(1, index).squeeze(1)


class Functions(NamedTuple):
    """The pure pieces `make` assembles (exposed for tests and for new algorithms).

    net: the QNetwork. outputs(params, obs, taus=None) -> [*, A, K] (IQN: taus [*, M] ->
    [*, A, M]). q_values(params, obs) -> [*, A] (IQN: the mean over num_quantile_samples
    fractions, `act_fractions`). loss(params, target_params, batch) -> (scalar loss, metrics) with
    `metrics["td_abs"]` [N], the priority signal: |TD| ("q"), KL(target || prediction)
    ("categorical"), mean |quantile TD| ("quantile", "iqn").
    """

    net: QNetwork
    outputs: Callable
    q_values: Callable
    loss: Callable


def functions(config: Config, spec: EnvSpec, network=None) -> Functions:
    """Build the network (with the torso `network` in place of `config.conv`'s when given) and
    its pure output, Q-value and loss functions for `config`."""
    head = config.head
    num_outputs = {"q": 1, "categorical": config.num_atoms, "quantile": config.num_quantiles, "iqn": 1}[head]
    net = QNetwork(spec.obs_shape, spec.num_actions, head, num_outputs, config.dueling, config.hidden,
                   config.activation, config.conv if network is None else network, config.cosine_dim)

    def support(like):
        return torch.linspace(config.v_min, config.v_max, config.num_atoms, dtype=like.dtype, device=like.device)

    def outputs(params, obs, taus=None):
        return call(net, params, obs) if taus is None else call(net, params, obs, taus)

    def sample_taus(obs, num):
        """IQN's quantile fractions tau ~ U(0, 1): [*, num] for obs [*, *obs_shape]."""
        return torch.rand(*obs.shape[:obs.ndim - len(spec.obs_shape)], num, device=obs.device)

    def mean_q(out):
        """Expected return per action [*, A] from head outputs [*, A, K]."""
        if head == "categorical":
            return (torch.softmax(out, dim=-1) * support(out)).sum(-1)
        return out.mean(-1)

    def act_taus(obs):
        """The K fractions of IQN's Q estimate, [*, K]: midpoints (a midpoint-rule quadrature of
        Q = integral of the quantile function over tau in (0, 1)) or fresh samples."""
        if config.act_fractions == "sampled":
            return sample_taus(obs, config.num_quantile_samples)
        mid = losses.quantile_midpoints(config.num_quantile_samples, torch.float32, obs.device)
        return mid.expand(*obs.shape[:obs.ndim - len(spec.obs_shape)], -1)

    def q_values(params, obs):
        return mean_q(outputs(params, obs, act_taus(obs) if head == "iqn" else None))

    def loss(params, target_params, batch):
        obs, action, next_obs = batch["obs"], batch["action"], batch["next_obs"]
        reward, discount = batch["reward"], batch["discount"]
        iqn = head == "iqn"
        taus = sample_taus(obs, config.num_tau_samples) if iqn else None
        out = outputs(params, obs, taus)
        target_next = outputs(target_params, next_obs, sample_taus(next_obs, config.num_tau_prime_samples)
                              if iqn else None).detach()
        # Q(s', .) of the network that selects the bootstrap action: online (double) or target
        next_q_select = (q_values(params, next_obs) if config.double_q else mean_q(target_next)).detach()
        next_action = next_q_select.argmax(-1)

        if head == "q":
            q, next_q = out.squeeze(-1), target_next.squeeze(-1)
            td = losses.double_q_learning_td(q, action, reward, discount, next_q, next_q_select)
            per_sample = losses.huber_loss(td, config.huber_delta) if config.huber_delta > 0 \
                else losses.squared_loss(td)
            td_abs = td.abs()
        elif head == "categorical":
            z = support(out)
            target = losses.categorical_q_target(reward, discount, _at_action(torch.softmax(target_next, -1),
                                                                               next_action), z)
            per_sample = losses.categorical_cross_entropy(_at_action(out, action), target)
            # KL(target || prediction) = cross-entropy - entropy(target): Rainbow's priority
            td_abs = per_sample + torch.special.xlogy(target, target).sum(-1)
        else:
            pred = _at_action(out, action)
            target = reward[:, None] + discount[:, None] * _at_action(target_next, next_action)
            fractions = losses.quantile_midpoints(config.num_quantiles, pred.dtype, pred.device) \
                if head == "quantile" else taus
            per_sample = losses.quantile_huber_loss(pred, target, fractions, config.huber_delta)
            td_abs = (target.unsqueeze(-2) - pred.unsqueeze(-1)).abs().mean((-2, -1))
        total = (per_sample * batch["weight"]).mean()
        q_taken = _at_action(mean_q(out.detach()).unsqueeze(-1), action).squeeze(-1)
        return total, {"q_mean": q_taken.mean(), "td_abs": td_abs.detach()}

    return Functions(net, outputs, q_values, loss)


def initial_priorities(config: Config, spec: EnvSpec, network=None) -> Callable:
    """Ape-X's actor-side priorities (Horgan et al. 2018, arXiv:1803.00933): the TD signal of
    `functions(...).loss` for the n-step transitions of a window of stored rows, with the acting
    parameters as both online and target network.

    Returns `priorities(params, window) -> td_abs [T, B]`: window is a TensorDict [n + T, B] of
    the replay's stored keys (obs, action, reward, terminated, done; n = config.n_step) and row t
    of the result is the transition of window row t, built as `fnrl.replay.sample` builds it
    (its n-step return over rows t .. t + m - 1 and the bootstrap observation obs[t + m]), so
    rows t < T are exactly those whose windows the buffer completes when the window's last T
    rows are added.
    """
    fns, n, gamma = functions(config, spec, network), config.n_step, config.gamma

    def priorities(params, window: TensorDict) -> torch.Tensor:
        T, B = window.batch_size[0] - n, window.batch_size[1]
        reward = window["reward"]
        discount = gamma * (~window["terminated"]).to(reward.dtype)
        returns, bootstrap_discount, offset = n_step_returns(reward, discount, window["done"], n)
        row = torch.arange(T, device=reward.device).unsqueeze(1) + offset[:T]
        batch = TensorDict({"obs": window["obs"][:T], "action": window["action"][:T], "reward": returns[:T],
                            "discount": bootstrap_discount[:T],
                            "next_obs": window["obs"][row, torch.arange(B, device=row.device)],
                            "weight": torch.ones(T, B, dtype=reward.dtype, device=reward.device)},
                           batch_size=[T, B]).reshape(T * B)
        return fns.loss(params, params, batch)[1]["td_abs"].reshape(T, B)

    return priorities


def planned_updates(config: Config) -> int:
    """The gradient updates a run makes: (total_steps - learning_starts) x replay_ratio (at least 1)."""
    return max(1, int((config.total_steps - config.learning_starts) * config.replay_ratio))


def _optimizer(config: Config):
    """Adam or RMSprop (as torch.optim's) with the learning rate stored in the state (decayed linearly to 0
    over `planned_updates` with `anneal_lr`), after a global-norm clip."""
    if config.optimizer == "adam":
        direction = optim.scale_by_adam(eps=config.optimizer_eps)
    else:
        direction = optim.scale_by_rms(alpha=config.rmsprop_alpha, eps=config.optimizer_eps)
    decay = optim.linear_schedule(1.0, 0.0, planned_updates(config)) if config.anneal_lr else None
    base = optim.chain(direction, optim.scale_by_stored_learning_rate(config.learning_rate, decay))
    if config.max_grad_norm > 0:
        return optim.chain(optim.clip_by_global_norm(config.max_grad_norm), base)
    return base


def target_update(config: Config, target: TensorDict, online: TensorDict, updates: torch.Tensor) -> TensorDict:
    """Every `target_update_interval` updates: target <- (1 - tau) target + tau online
    (tau = 1: an exact copy); otherwise target unchanged (exactly).

    One Polyak step with weight tau * [updates % K == 0]: lerp returns its start exactly for
    weight 0 and its end exactly for weight 1, so there is no Python branch on the counter.
    `updates` counts the updates done, this one included.
    """
    due = ((updates % config.target_update_interval) == 0).to(torch.float32)
    return optim.polyak(target, online, due * config.tau)


def make(config: Config, spec: EnvSpec, network=None) -> Agent:
    """Bind the DQN family to an environment: returns `Agent(init, act, update)` of pure functions.

    network: a torso of your own in place of the built-in one (an nn.Module, a factory
        `factory(obs_shape) -> (module, out_dim)`, or "module:name"; `fnrl.nets.core.user_torso`),
        the heads on top; default: `config.conv`'s.
    """
    validate(config, spec)
    fns = functions(config, spec, network)
    opt = _optimizer(config)

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
        q = fns.q_values(state["params"], obs)
        eps = epsilon(config, state["env_steps"], q.shape[0]) if explore else config.eps_eval
        return epsilon_greedy(q, eps), {}, carry

    def update(state: TensorDict, batch: TensorDict):
        params, opt_state, metrics = gradient_step(fns.loss, state["params"], opt, state["opt_state"],
                                                   state["target_params"], batch)
        updates = state["updates"] + 1
        new_state = state.copy()
        new_state["params"], new_state["opt_state"], new_state["updates"] = params, opt_state, updates
        new_state["target_params"] = target_update(config, state["target_params"], params, updates)
        td_abs = metrics.pop("td_abs")
        metrics["loss/q"] = metrics.pop("loss")
        metrics["td_abs_mean"] = td_abs.mean()
        metrics["epsilon"] = epsilon(config, state["env_steps"], config.num_envs).mean()
        if config.prioritized:
            metrics["priority"] = td_abs
        return new_state, TensorDict(metrics, batch_size=[])

    return Agent(init=init, act=act, update=update)
