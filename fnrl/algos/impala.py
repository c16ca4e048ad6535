"""IMPALA: actor-learner training with V-trace (Espeholt et al. 2018, arXiv:1802.01561),
with SEED RL's central batched inference (Espeholt et al. 2020, arXiv:1910.06591).

Actor processes step EnvPool; a central inference server in the learner process picks
their actions with the latest parameters, and the learner trains on [T, B] trajectories
whose actions came from slightly older policies mu (the policy lag). V-trace corrects
for it, with rho_t = pi(a_t|x_t) / mu(a_t|x_t):

    vs_t = V(x_t) + sum_{s>=t} gamma^{s-t} (prod_{t<=i<s} c_i) min(rho_bar, rho_s) delta_s,
    delta_s = r_s + gamma V(x_{s+1}) - V(x_s),   c_i = lam * min(c_bar, rho_i),

    L = -min(pg_rho_bar, rho_t) (r_t + gamma vs_{t+1} - V(x_t)) log pi(a_t|x_t)
        + vf_coef (vs_t - V(x_t))^2 / 2 - ent_coef H(pi(.|x_t)),

averaged over the valid steps, one gradient step (RMSprop, as in the paper) per batch of
`batch_size` trajectories. Episode ends cut the traces; truncated episodes bootstrap from
their final observation. `core="lstm"|"gru"` makes the policy recurrent: the server keeps
each env's carry, and the loss re-unrolls each trajectory from its initial carry.

The runtime (actor processes, inference server, bounded trajectory queue) is
fnrl.samplers.central, or with `--actor-hosts N` env hosts over torch.distributed
(fnrl.distributed.env_hosts), wired by fnrl.train_central; this module holds only the math:

    agent = impala.make(impala.Config(), env.spec)
    state = agent.init(seed=0)
    action, extras, carry = agent.act(state, obs, None, explore=True)   # extras: logp (+ carry)
    state, metrics = agent.update(state, trajectories)                  # one gradient step
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from fnrl import losses, optim
from fnrl.algos.common import (Agent, action_dist, check_positive, config_policy, gradient_step, init_params,
                               masked_means)
from fnrl.algos.spec import AlgorithmSpec
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets.core import check_conv
from fnrl.returns import vtrace

SPEC = AlgorithmSpec(kind="on_policy", runtime="central")
"""train() hands this algorithm to fnrl.train_central (actor processes + central inference)."""


@dataclass
class Config:
    """IMPALA settings. Defaults learn CartPole-v1 with 2 actor processes of 8 envs each
    (return >= 400 within 300k env steps in 46 of 48 runs, median 45k; the other two hovered
    near 220. Runs are not bit-reproducible, since the policy lag depends on timing). A2C-like
    gradient clipping (0.5) keeps runs from stalling near 200; the paper's Atari setting is
    max_grad_norm 40, num_steps 20."""

    env_id: str = "CartPole-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 300_000
    """total environment steps consumed by the learner (all actors together)"""
    num_actors: int = 2
    """actor processes, each stepping its own pool of num_envs envs"""
    num_envs: int = 8
    """envs per actor B"""
    num_steps: int = 10
    """trajectory length T (unroll length)"""
    batch_size: int = 2
    """trajectories per learner update (concatenated along the env dimension)"""
    queue_size: int = 8
    """trajectory slots in flight (being filled or queued) at most: the bounded queue"""
    batch_wait_ms: float = 2.0
    """after the first request, how long the inference server waits for the other actors"""
    optimizer: str = "rmsprop"
    """rmsprop (the IMPALA paper) or adam"""
    learning_rate: float = 1e-3
    """step size"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training"""
    rms_alpha: float = 0.99
    """RMSprop smoothing constant"""
    rms_eps: float = 1e-5
    """RMSprop / Adam epsilon"""
    gamma: float = 0.99
    """discount factor"""
    vtrace_lambda: float = 1.0
    """lambda of the V-trace traces c_t (1.0 = the paper's V-trace)"""
    rho_clip: float = 1.0
    """rho_bar: clip of the importance weights in the value targets"""
    c_clip: float = 1.0
    """c_bar: clip of the trace coefficients"""
    pg_rho_clip: float = 1.0
    """clip of the importance weights of the policy-gradient advantages"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    hidden: tuple[int, ...] = (64, 64)
    """MLP hidden sizes (vector observations)"""
    activation: str = "tanh"
    """MLP activation: tanh or relu"""
    conv: str = "nature"
    """torso: nature or a3c (conv, for image observations), or your own torso factory as module:name
    (any tensor observation; `fnrl.nets.core.user_torso`)"""
    init_log_std: float = 0.0
    """initial log standard deviation of continuous actions"""
    core: str = "none"
    """recurrent core after the torso: none (feed-forward), lstm or gru"""
    core_size: int = 128
    """hidden size of the recurrent core"""


def validate(config: Config, spec: EnvSpec | None = None) -> None:
    """Raise ConfigError for settings that cannot work, before any process starts."""
    check_positive(config, "total_steps", "num_actors", "num_envs", "num_steps", "batch_size", "queue_size",
                   "learning_rate", "gamma", "rho_clip", "c_clip", "pg_rho_clip", "max_grad_norm")
    if config.batch_wait_ms < 0:
        raise ConfigError(f"--batch-wait-ms must be >= 0, got {config.batch_wait_ms}")
    if config.queue_size < config.num_actors:
        raise ConfigError(f"--queue-size {config.queue_size} is smaller than --num-actors {config.num_actors}; "
                          f"every actor needs a trajectory slot")
    if config.queue_size < config.batch_size:
        raise ConfigError(f"--queue-size {config.queue_size} is smaller than --batch-size {config.batch_size}; "
                          f"the learner could never fill a batch")
    if config.optimizer not in ("rmsprop", "adam"):
        raise ConfigError(f"--optimizer must be rmsprop or adam, got {config.optimizer!r}")
    if not 0.0 <= config.vtrace_lambda <= 1.0:
        raise ConfigError(f"--vtrace-lambda must be in [0, 1], got {config.vtrace_lambda}")
    if config.core not in ("none", "lstm", "gru"):
        raise ConfigError(f"--core must be none, lstm or gru, got {config.core!r}")
    if config.activation not in ("tanh", "relu"):
        raise ConfigError(f"--activation must be tanh or relu, got {config.activation!r}")
    check_conv(config.conv)
    if spec is not None and isinstance(spec.obs_shape, dict):
        raise ConfigError(f"impala needs a tensor observation space; {spec.env_id} has dict observations")


def vtrace_targets(config: Config, batch: TensorDict, logp: torch.Tensor, value: torch.Tensor,
                   last_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets vs and policy-gradient advantages of a trajectory batch.

    batch: [T, B] with `logp` (the behaviour policy's log mu(a_t|x_t)), `reward`,
    `terminated`, `done`; logp: [T, B] log pi(a_t|x_t) under the learner's params;
    value: [T, B] V(x_t); last_value: [B] V of the final next observation.
    log rho_t = log pi - log mu; discount_t = gamma (1 - terminated_t); `done` cuts the
    traces (fnrl.returns.vtrace). Returns (vs, pg_advantage), [T, B], detached.
    """
    value, last_value = value.detach(), last_value.detach()
    next_value = torch.cat([value[1:], last_value[None]])
    discount = config.gamma * (~batch["terminated"]).to(value.dtype)
    return vtrace(logp.detach() - batch["logp"], batch["reward"], value, next_value, discount, batch["done"],
                  config.vtrace_lambda, config.rho_clip, config.c_clip, config.pg_rho_clip)


def make(config: Config, spec: EnvSpec, network=None) -> Agent:
    """Bind IMPALA to an environment: `Agent(init, act, update)`; `update` is one gradient step.

    network: a torso of your own in place of the built-in one (an nn.Module, a factory
        `factory(obs_shape) -> (module, out_dim)`, or "module:name"; `fnrl.nets.core.user_torso`),
        the heads on top; default: `config.conv`'s.
    """
    validate(config, spec)
    dist = action_dist(spec)
    build, rnn, policy = config_policy(config, spec, network)
    recurrent = rnn is not None
    per_update = config.num_steps * config.num_envs * config.batch_size
    updates = max(1, config.total_steps // per_update)
    lr = optim.linear_schedule(config.learning_rate, 0.0, updates) if config.anneal_lr else config.learning_rate
    if config.optimizer == "rmsprop":
        base = optim.rmsprop(lr, alpha=config.rms_alpha, eps=config.rms_eps)
    else:
        base = optim.adam(lr, eps=config.rms_eps)
    opt = optim.chain(optim.clip_by_global_norm(config.max_grad_norm), base)

    def init(seed: int) -> TensorDict:
        params = init_params(build, seed)
        return TensorDict({"params": params, "opt_state": opt.init(params),
                           "env_steps": torch.zeros((), dtype=torch.int64)}, batch_size=[])

    def act(state, obs, carry, explore: bool = True):
        extras = {}
        if recurrent:
            d, _, carry, extras["carry"] = rnn.step(state["params"], obs, carry)
        else:
            d, _ = policy(state["params"], obs, value=False)
        action = dist.sample(*d) if explore else dist.mode(*d)
        return action, {"logp": dist.log_prob(*d, action), **extras}, carry

    def loss(params, batch):
        if recurrent:  # re-unroll from the trajectory's initial carry, one step past its end
            obs_all = torch.cat([batch["obs"], batch["next_obs"][-1:]])
            d, value_all = rnn.rollout_unroll(params, obs_all, batch)
            d, value, last_value = tuple(x[:-1] for x in d), value_all[:-1], value_all[-1]
        else:
            d, value = policy(params, batch["obs"])
            _, last_value = policy(params, batch["next_obs"][-1])
        logp = dist.log_prob(*d, batch["action"])
        vs, pg_adv = vtrace_targets(config, batch, logp, value, last_value)
        mean_of = masked_means(batch["valid"], logp.dtype)   # over the valid steps
        pg = losses.policy_gradient_loss(logp, pg_adv)
        v_loss = losses.squared_loss(value - vs)
        entropy = dist.entropy(*d)
        total = mean_of(pg + config.vf_coef * v_loss - config.ent_coef * entropy)
        rho = (logp.detach() - batch["logp"]).exp()
        means = mean_of(pg.detach(), v_loss.detach(), entropy.detach(), rho, pg_adv.detach())   # one reduction
        return total, dict(zip(("loss/policy", "loss/value", "loss/entropy", "rho_mean", "advantage_mean"), means))

    def update(state: TensorDict, batch: TensorDict):
        params, opt_state, metrics = gradient_step(loss, state["params"], opt, state["opt_state"], batch)
        new_state = state.copy()
        new_state["params"], new_state["opt_state"] = params, opt_state
        return new_state, TensorDict(metrics, batch_size=[])

    return Agent(init=init, act=act, update=update)
