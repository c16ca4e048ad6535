"""Advantage actor-critic (A2C, the synchronous A3C of Mnih et al. 2016, arXiv:1602.01783).

One gradient step per [T, B] rollout on
    L = -log pi(a|s) A + c_v (G - V(s))^2 / 2 - c_e H(pi(.|s)),
with A = GAE(lambda) (lambda = 1 gives rlpyt's n-step returns minus values) and
G = A + V, bootstrapping from the final observation on truncation. `core="lstm"|"gru"`
makes the policy recurrent: the loss re-unrolls each [T, B] rollout from its stored
initial state `rollout["carry"][0]` with the episode-start mask `rollout["reset"]`.

    agent = a2c.make(a2c.Config(), env.spec)
    state = agent.init(seed=0)
    state, metrics = agent.update(state, rollout)
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
from fnrl.normalize import rms_init, scale_rewards
from fnrl.returns import gae

ACT_KEYS = ("params",)
"""The state `act` reads (the training loop passes a compiled `act` only these: fewer guards)."""

SWEEPABLE = ("learning_rate", "ent_coef", "vf_coef", "gamma", "gae_lambda")
"""Config fields held as tensors in the state (`state["hp"]`, the optimizer's stored rate),
so `fnrl train a2c --sweep FIELD=v1,v2` can train several values in one vmapped process."""
SPEC = AlgorithmSpec(kind="on_policy", act_keys=ACT_KEYS, sweepable=SWEEPABLE)


@dataclass
class Config:
    """A2C settings (rlpyt's defaults: RMSprop 7e-4, 5-step rollouts; 16 envs here)."""

    env_id: str = "CartPole-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 300_000
    """total environment steps"""
    num_envs: int = 16
    """parallel environments B"""
    num_steps: int = 5
    """rollout length T"""
    learning_rate: float = 7e-4
    """RMSprop step size"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0"""
    rms_alpha: float = 0.99
    """RMSprop smoothing constant"""
    rms_eps: float = 1e-5
    """RMSprop epsilon"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 1.0
    """GAE lambda (1.0 = n-step returns)"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    normalize_reward: bool = False
    """divide rewards by the running std of the discounted return (BatchPPO's reward scaling)"""
    hidden: tuple[int, ...] = (64, 64)
    """MLP hidden sizes"""
    activation: str = "tanh"
    """MLP activation: tanh or relu"""
    conv: str = "a3c"
    """torso: nature or a3c (conv, for image observations), or your own torso factory as module:name
    (any tensor observation; `fnrl.nets.core.user_torso`)"""
    init_log_std: float = 0.0
    """initial log standard deviation of continuous actions"""
    core: str = "none"
    """recurrent core after the torso: none (feed-forward), lstm or gru"""
    core_size: int = 128
    """hidden size of the recurrent core"""


def validate(config: Config, spec: EnvSpec | None = None) -> None:
    check_positive(config, "total_steps", "num_envs", "num_steps", "learning_rate")
    if config.activation not in ("tanh", "relu"):
        raise ConfigError(f"--activation must be tanh or relu, got {config.activation!r}")
    check_conv(config.conv)
    if config.core not in ("none", "lstm", "gru"):
        raise ConfigError(f"--core must be none, lstm or gru, got {config.core!r}")


def make(config: Config, spec: EnvSpec, network=None) -> Agent:
    """Bind A2C to an environment: `Agent(init, act, update)`; `update` is one synchronous
    gradient step on a rollout.

    network: a torso of your own in place of the built-in one (an nn.Module, a factory
        `factory(obs_shape) -> (module, out_dim)`, or "module:name"; `fnrl.nets.core.user_torso`),
        the heads on top; default: `config.conv`'s.
    """
    validate(config, spec)
    dist = action_dist(spec)
    build, rnn, policy = config_policy(config, spec, network)
    recurrent = rnn is not None
    updates = max(1, config.total_steps // (config.num_envs * config.num_steps))
    decay = optim.linear_schedule(1.0, 0.0, updates) if config.anneal_lr else None
    opt = optim.chain(optim.clip_by_global_norm(config.max_grad_norm),
                      optim.scale_by_rms(alpha=config.rms_alpha, eps=config.rms_eps),
                      optim.scale_by_stored_learning_rate(config.learning_rate, decay))

    def init(seed: int) -> TensorDict:
        params = init_params(build, seed)
        hp = {k: torch.tensor(float(getattr(config, k))) for k in SWEEPABLE if k != "learning_rate"}
        state = {"params": params, "opt_state": opt.init(params), "env_steps": torch.zeros((), dtype=torch.int64),
                 "seed": torch.tensor(seed, dtype=torch.int64), "hp": TensorDict(hp, batch_size=[])}
        if config.normalize_reward:
            state["rew_rms"], state["ret"] = rms_init(()), torch.zeros(config.num_envs)
        return TensorDict(state, batch_size=[])

    def act(state, obs, carry, explore: bool = True):
        extras = {}
        if recurrent:
            d, _, carry, extras["carry"] = rnn.step(state["params"], obs, carry)
        else:
            d, _ = policy(state["params"], obs, value=False)
        action = dist.sample(*d) if explore else dist.mode(*d)
        return action, extras, carry

    def loss(params, rollout, hp):
        if recurrent:  # re-unroll the segment from its stored initial state, one step past its end
            d, value = rnn.rollout_unroll(params, torch.cat([rollout["obs"], rollout["next_obs"][-1:]]), rollout)
            d, value, last_value = tuple(x[:-1] for x in d), value[:-1], value[-1]
        else:
            d, value = policy(params, rollout["obs"])
            _, last_value = policy(params, rollout["next_obs"][-1])
        next_value = torch.cat([value[1:], last_value[None]]).detach()
        discount = hp["gamma"] * (~rollout["terminated"]).to(value.dtype)
        advantage = gae(rollout["reward"], value.detach(), next_value, discount, rollout["done"], hp["gae_lambda"])
        mean_of = masked_means(rollout["valid"], value.dtype)   # over the valid steps
        pg = losses.policy_gradient_loss(dist.log_prob(*d, rollout["action"]), advantage)
        v_loss = losses.squared_loss(value - (advantage + value.detach()))
        entropy = dist.entropy(*d)
        total = mean_of(pg + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy)
        means = mean_of(pg.detach(), v_loss.detach(), entropy.detach())   # the metrics, as one reduction
        return total, dict(zip(("loss/policy", "loss/value", "loss/entropy"), means))

    def update(state: TensorDict, rollout: TensorDict):
        new_state = state.copy()
        if config.normalize_reward:
            rollout = rollout.copy()
            rollout["reward"], new_state["rew_rms"], new_state["ret"] = scale_rewards(
                state["rew_rms"], state["ret"], rollout["reward"], rollout["done"], rollout["valid"],
                state["hp"]["gamma"])
        params, opt_state, metrics = gradient_step(loss, state["params"], opt, state["opt_state"], rollout,
                                                   state["hp"])
        new_state["params"], new_state["opt_state"] = params, opt_state
        return new_state, TensorDict(metrics, batch_size=[])

    return Agent(init=init, act=act, update=update)
