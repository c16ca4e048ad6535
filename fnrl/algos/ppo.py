"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

Clipped surrogate or adaptive-KL penalty, GAE, value clipping, advantage
normalization, linear learning-rate and clip annealing, gradient-norm clipping, and
BatchPPO's running observation and reward normalization (Hafner et al. 2017).
Discrete (categorical), multi-discrete (independent categoricals: gymnasium's MultiDiscrete and
MultiBinary) and continuous (Gaussian, state-independent log-std) actions.

Recurrent PPO (`core="lstm"` or `"gru"`): the policy carries an LSTM/GRU state
(fnrl.nets.recurrent). The rollout records the state each step started from
(`rollout["carry"]`) and the episode-start mask (`rollout["reset"]`); training
re-unrolls every [T, b] minibatch from the segment's initial state
`rollout["carry"][0]`, with the state zeroed inside the unroll where an episode starts,
and minibatches split only the env dimension (whole sequences).

    agent = ppo.make(ppo.Config(), env.spec)
    state = agent.init(seed=0)
    action, extras, carry = agent.act(state, obs, None, explore=True)
    state, metrics = agent.update(state, rollout)        # all epochs and minibatches

`update` is pure. Compiled (`make(..., compile=True)`) on the CPU, a feed-forward policy's
whole iteration (advantages, every epoch and minibatch, the metrics) runs as one AOTInductor
model (`fnrl.accel.aot`), given the minibatch order; elsewhere (a recurrent core, a rollout laid out
otherwise than the first one, or a model that cannot be built) its pieces run
`torch.compile`d. On a GPU the pieces run `torch.compile`d, the minibatch steps as a loop of
one compiled step (`fnrl.accel.staged.scan_on`), which `fnrl train --cuda-graphs` replays from one
CUDA graph.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from tensordict import TensorDict

from fnrl import losses, optim, rng
from fnrl.accel.staged import staged_update
from fnrl.algos.common import (Agent, action_dist, check_positive, config_policy, gradient_step, init_params,
                               masked_mean, masked_means, scan_steps, shares_torso, take_rows)
from fnrl.algos.spec import AlgorithmSpec
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets.core import check_conv
from fnrl.normalize import rms_init, rms_normalize, rms_update, scale_rewards
from fnrl.returns import gae

ACT_KEYS = ("params", "obs_rms")
"""The state `act` reads (the training loop passes a compiled `act` only these: fewer guards)."""

SWEEPABLE = ("learning_rate", "ent_coef", "vf_coef", "clip_coef", "gamma", "gae_lambda")
"""Config fields held as tensors in the state (`state["hp"]`, the optimizer's stored rate),
so `fnrl train ppo --sweep FIELD=v1,v2` can train several values in one vmapped process."""
SPEC = AlgorithmSpec(kind="on_policy", act_keys=ACT_KEYS, sweepable=SWEEPABLE, make_options=("compile", "batched"))


@dataclass
class Config:
    """PPO settings. Defaults learn CartPole-v1 to 500 within 100k steps (rl-zoo's tuned
    CartPole settings); `experiments/` holds CleanRL's Atari and MuJoCo settings."""

    env_id: str = "CartPole-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 100_000
    """total environment steps (all envs together)"""
    num_envs: int = 8
    """parallel environments B"""
    num_steps: int = 32
    """rollout length T per environment and iteration"""
    learning_rate: float = 1e-3
    """Adam step size"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training"""
    gamma: float = 0.98
    """discount factor"""
    gae_lambda: float = 0.8
    """GAE lambda"""
    num_minibatches: int = 1
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: int = 20
    """passes over each rollout"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """surrogate clipping range epsilon"""
    anneal_clip: bool = True
    """decay the clipping range linearly to 0 over training"""
    clip_vloss: bool = False
    """clip the value loss around the old values (range clip_coef)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    penalty: str = "clip"
    """"clip" (clipped surrogate) or "kl" (adaptive KL penalty)"""
    kl_target: float = 0.01
    """target KL per update for the adaptive penalty"""
    kl_init_coef: float = 1.0
    """initial KL penalty coefficient beta"""
    normalize_obs: bool = False
    """running mean/std observation normalization (BatchPPO)"""
    normalize_reward: bool = False
    """scale rewards by the running std of the discounted return (BatchPPO)"""
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
    """Raise ConfigError for settings that cannot work, before any training."""
    check_positive(config, "total_steps", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                   "learning_rate")
    if config.core not in ("none", "lstm", "gru"):
        raise ConfigError(f"--core must be none, lstm or gru, got {config.core!r}")
    batch = config.num_envs * config.num_steps
    if config.core != "none":
        check_positive(config, "core_size")
        if config.num_envs % config.num_minibatches:
            raise ConfigError(f"--num-minibatches {config.num_minibatches} does not divide --num-envs "
                              f"{config.num_envs}; recurrent minibatches split only the env dimension")
    elif batch % config.num_minibatches:
        raise ConfigError(f"--num-minibatches {config.num_minibatches} does not divide the batch "
                          f"num_envs x num_steps = {batch}; pick a divisor of {batch}")
    if config.penalty not in ("clip", "kl"):
        raise ConfigError(f"--penalty must be clip or kl, got {config.penalty!r}")
    if config.activation not in ("tanh", "relu"):
        raise ConfigError(f"--activation must be tanh or relu, got {config.activation!r}")
    check_conv(config.conv)


def _permutations(seed: int, env_steps: int, epochs: int, size: int) -> torch.Tensor:
    """`epochs` random permutations of range(size) [epochs, size], a pure function of
    (seed, env_steps), `seed` the run's minibatch stream (`fnrl.rng.MINIBATCH`, held in the
    state as "seed"): a run's minibatches depend on its own seed only, never on the global
    RNG, so seed k of a vmapped run (fnrl.seeds) draws what a single run would."""
    g = torch.Generator().manual_seed((seed * 0x9E3779B97F4A7C15 + env_steps) % 2**64)
    # randperm shuffles in O(size); argsort of uniforms sorted in O(size log size), ~10x slower at 8192
    return torch.stack([torch.randperm(size, generator=g) for _ in range(epochs)])


def _clip_range(config: Config, hp, env_steps):
    """The clipping range: clip_coef, annealed linearly to 0 over total_steps with anneal_clip."""
    if not config.anneal_clip:
        return hp["clip_coef"]
    progress = env_steps.to(torch.float32) / config.total_steps
    return hp["clip_coef"] * (1.0 - progress).clamp(min=0.0)


def _epochs(step, rows: bool, clip_range):
    """`train_epochs(params, opt_state, flat, perms, env_steps, kl_coef, hp)`: every step of
    `step` (one minibatch step; of K rows when `rows`, every argument [K, ...]) in order over
    the minibatch indices perms [(K,) E * M, mb] -> (params, opt_state, metrics [(K,) E * M],
    clip range). Inside a compiled graph the steps are one scan (`scan_steps`), outside it a
    Python loop (the GPU's loop of one compiled step, `fnrl.accel.staged.scan_on`).

    The clip range is computed here, inside the graph that holds the scan: passed in from
    `prepare` it could alias hp["clip_coef"] (it is that tensor without annealing), and a
    higher-order op refuses operands that alias (for rows, the vmapped range is copied)."""
    def train_epochs(params, opt_state, flat, perms, env_steps, kl_coef, hp):
        clip = torch.func.vmap(clip_range)(hp, env_steps).clone() if rows else clip_range(hp, env_steps)

        def body(carry, index):
            params, opt_state, metrics = step(*carry, flat, index, clip, kl_coef, hp)
            return (params, opt_state), metrics

        (params, opt_state), history = scan_steps(body, (params, opt_state),
                                                  perms.transpose(0, 1) if rows else perms)
        return params, opt_state, {k: v.transpose(0, 1) for k, v in history.items()} if rows else history, clip
    return train_epochs


def _loss(config: Config, dist, forward):
    """`loss(params, mb, clip, kl_coef, hp) -> (loss, metrics)` of PPO with action distribution
    `dist` and `forward(params, batch) -> (dist params, value)`."""
    def loss(params, mb, clip, kl_coef, hp):
        """The minibatch loss: surrogate (clipped, or KL-penalized) + vf_coef x value loss -
        ent_coef x entropy, averaged over valid steps; and its metrics."""
        d, value = forward(params, mb)
        logp = dist.log_prob(*d, mb["action"])
        mean_of = masked_means(mb["valid"], logp.dtype)   # over the valid steps
        adv = mb["advantage"]
        if config.norm_adv:
            mean = mean_of(adv)
            std = mean_of((adv - mean) ** 2).sqrt()
            adv = (adv - mean) / (std + 1e-8)
        if config.penalty == "clip":
            pg, clipped = losses.clipped_surrogate_loss(logp, mb["logp"], adv, clip)
        else:
            old = tuple(mb[f"old_dist{i}"] for i in range(len(d)))
            pg = losses.kl_penalty_loss(logp, mb["logp"], adv, dist.kl(old, d), kl_coef)
            clipped = ((logp - mb["logp"]).exp() - 1).abs().gt(clip).to(logp.dtype)
        if config.clip_vloss:
            v_loss = losses.clipped_value_loss(value, mb["value"], mb["target"], clip)
        else:
            v_loss = losses.squared_loss(value - mb["target"])
        entropy = dist.entropy(*d)
        total = mean_of(pg + hp["vf_coef"] * v_loss - hp["ent_coef"] * entropy)
        # the metrics from detached terms (no autograd records for them in eager mode), as one reduction
        means = mean_of(pg.detach(), v_loss.detach(), entropy.detach(),
                        losses.approx_kl(logp.detach(), mb["logp"]), clipped.detach())
        return total, dict(zip(("loss/policy", "loss/value", "loss/entropy", "approx_kl", "clipfrac"), means))

    return loss


def _preparation(config: Config, rnn, policy, observe, value_in_act: bool, T: int, B: int):
    """`prepare(state, rollout, last_obs) -> (state, flat batch, explained variance)`: advantages,
    targets and the normalizers' updates."""
    recurrent = config.core != "none"
    n = T * B

    def prepare(state: TensorDict, rollout: TensorDict, last_obs: torch.Tensor):
        """Advantages, targets and normalizer updates: the training batch ([T*B] steps, or
        [T, B] sequences for a recurrent policy). last_obs [B, ...]: the observation after
        the rollout's last step (rollout["next_obs"][-1])."""
        params, hp = state["params"], state["hp"]
        new_state = state.copy()
        obs = observe(state, rollout["obs"])
        reward = rollout["reward"]
        if config.normalize_reward:
            reward, new_state["rew_rms"], new_state["ret"] = scale_rewards(
                state["rew_rms"], state["ret"], reward, rollout["done"], rollout["valid"], hp["gamma"])
        if config.normalize_obs:
            flat_obs = rollout["obs"].reshape(n, *rollout["obs"].shape[2:])
            new_state["obs_rms"] = rms_update(state["obs_rms"], flat_obs, rollout["valid"].reshape(n))
        # the values of every observation and of the last next one [T + 1, B] (a recurrent policy
        # re-unrolled from the segment's first carry); the policy's outputs too where needed
        last_obs = observe(state, last_obs[None])
        if recurrent:
            old_dist, value_all = rnn.rollout_unroll(params, torch.cat([obs, last_obs]), rollout)
        elif value_in_act and config.penalty != "kl":
            value_all = torch.cat([rollout["value"], policy(params, last_obs)[1]])
        else:
            old_dist, value_all = policy(params, torch.cat([obs, last_obs]))
        value, next_value = value_all[:-1], value_all[1:]
        discount = hp["gamma"] * (~rollout["terminated"]).to(value.dtype)
        advantage = gae(reward, value, next_value, discount, rollout["done"], hp["gae_lambda"])
        batch = {"obs": obs, "action": rollout["action"], "logp": rollout["logp"], "value": value,
                 "advantage": advantage, "target": advantage + value, "valid": rollout["valid"]}
        if recurrent:
            batch.update(reset=rollout["reset"], carry=rollout["carry"])
        if config.penalty == "kl":
            batch.update({f"old_dist{i}": x[:-1] for i, x in enumerate(old_dist)})
        flat = TensorDict(batch, batch_size=[T, B])
        if not recurrent:
            flat = flat.reshape(n)
        valid, target = flat["valid"], flat["target"]
        var_t = masked_mean((target - masked_mean(target, valid)) ** 2, valid)
        explained_var = 1 - masked_mean((target - flat["value"]) ** 2, valid) / (var_t + 1e-8)
        return new_state, flat, explained_var

    return prepare


def _iteration(config: Config, pieces, state: TensorDict, rollout: TensorDict, last_obs: torch.Tensor,
               perms: torch.Tensor):
    """All epochs x minibatches of one iteration in the minibatch order `perms` [(K,) E*M, mb]:
    (new state, metrics), from `pieces` = (prepare, train_epochs, kl_adapt)."""
    prepare, train_epochs, kl_adapt = pieces
    new_state, flat, explained_var = prepare(state, rollout, last_obs)
    params, opt_state, hp = state["params"], state["opt_state"], state["hp"]
    rows = state.batch_size  # [] or [K] (batched)
    kl_coef = state["kl_coef"] if config.penalty == "kl" else torch.zeros(rows, device=perms.device)
    params, opt_state, history, clip = train_epochs(params, opt_state, flat, perms,
                                                    state["env_steps"], kl_coef, hp)
    metrics = {k: v.mean(-1) for k, v in history.items()}
    if config.penalty == "kl":
        new_state["kl_coef"] = metrics["kl_coef"] = kl_adapt(params, flat, kl_coef)
    metrics.update(explained_variance=explained_var, clip_coef=clip)
    new_state["params"], new_state["opt_state"] = params, opt_state
    return new_state, TensorDict(metrics, batch_size=rows)


def make(config: Config, spec: EnvSpec, compile: bool = False, batched: bool = False,
         ahead_of_time: bool = True, network=None) -> Agent:
    """Bind PPO to an environment: returns `Agent(init, act, update)`.

    `update` runs all epochs and minibatches of one iteration: `prepare` (advantages, targets,
    normalizers) -> every minibatch step in order (a scan) -> `kl_adapt`, all pure. How they run
    (eager, compiled, one ahead-of-time model of the whole iteration on the CPU for a
    feed-forward policy, a loop of one compiled step on a GPU) is `fnrl.accel.staged`'s choice;
    ahead_of_time=False rules the model out (`fnrl.accel.AccelOptions`).

    batched: `update` takes states [K] (stacked `init`s) and rollouts [K, T, B] and trains the
    K rows independently, each piece `torch.func.vmap`-ed over the leading axis (the minibatch
    loop: one scan of vmapped steps) before it is compiled (fnrl.seeds: many seeds / settings at
    once); the fields in SWEEPABLE are read from the state, so rows may differ in them.
    network: your torso in place of `config.conv`'s (`fnrl.nets.core.user_torso`).
    """
    validate(config, spec)
    dist = action_dist(spec)
    T, B, n = config.num_steps, config.num_envs, config.num_steps * config.num_envs
    recurrent = config.core != "none"
    # recurrent: minibatches are sets of whole env sequences [T, b]; else sets of steps [n / m]
    mb_size = (B if recurrent else n) // config.num_minibatches
    opt = _optimizer(config)
    build, rnn, policy = config_policy(config, spec, network)

    def forward(params, batch):
        """(dist, value) of the policy on a training batch: [N] steps, or [T, b] sequences."""
        if recurrent:
            d, value, _ = rnn.unroll(params, batch["obs"], batch["reset"], batch["carry"][0])
            return d, value
        return policy(params, batch["obs"])

    def observe(state, obs):
        return rms_normalize(state["obs_rms"], obs) if config.normalize_obs else obs

    # the critic's values: recorded while acting where they cost one head on the actor's torso (images),
    # else evaluated by `prepare` on the whole rollout in one batched call, with the parameters that acted
    value_in_act = not recurrent and shares_torso(spec.obs_shape)

    def act(state, obs, carry, explore: bool = True):
        """The action and `extras`: its log-probability `logp`, and `value` where `value_in_act`
        (a recurrent policy's `carry` too)."""
        extras = {}
        if recurrent:
            d, value, carry, extras["carry"] = rnn.step(state["params"], observe(state, obs), carry)
        else:
            d, value = policy(state["params"], observe(state, obs), value=value_in_act)
        if value_in_act:
            extras["value"] = value
        action = dist.sample(*d) if explore else dist.mode(*d)
        return action, {"logp": dist.log_prob(*d, action), **extras}, carry

    loss = _loss(config, dist, forward)
    prepare = _preparation(config, rnn, policy, observe, value_in_act, T, B)

    def minibatch_step(params, opt_state, flat, index, clip, kl_coef, hp):
        mb = flat[:, index] if recurrent else take_rows(flat, index)
        return gradient_step(loss, params, opt, opt_state, mb, clip, kl_coef, hp)

    def kl_adapt(params, flat, kl_coef):
        """BatchPPO's penalty coefficient update from the KL between old and new policy."""
        new_dist, _ = forward(params, flat)
        old_dist = tuple(flat[f"old_dist{i}"] for i in range(len(new_dist)))
        kl = masked_mean(dist.kl(old_dist, new_dist), flat["valid"])
        return losses.adaptive_kl_coef(kl_coef, kl, config.kl_target)

    # K rows (batched): each minibatch step vmapped over the rows, inside the scan, where make_fx traces it
    step = torch.func.vmap(minibatch_step, randomness="different") if batched else minibatch_step
    if batched:
        prepare, kl_adapt = (torch.func.vmap(f, randomness="different") for f in (prepare, kl_adapt))

    def minibatch_order(state: TensorDict, device) -> torch.Tensor:
        """perms [(K,) E*M, mb]: each row's epochs of minibatch indices, from its seed and env steps."""
        rows = state.batch_size
        seeds, steps = state["seed"].reshape(-1).tolist(), state["env_steps"].reshape(-1).tolist()
        perms = torch.stack([_permutations(s, t, config.update_epochs, B if recurrent else n)
                             for s, t in zip(seeds, steps)]).to(device)
        return perms.view(*rows, -1, mb_size)

    steps = functools.partial(_epochs, rows=batched, clip_range=functools.partial(_clip_range, config))
    run = staged_update(functools.partial(_iteration, config), prepare, steps, step, kl_adapt, compile=compile,
                        ahead_of_time=ahead_of_time and not recurrent, subject="the PPO update is",
                        # next_obs shares obs's memory (one [T + 1] buffer): the model reads obs and a
                        # copy of its last row
                        export_args=lambda state, rollout, last_obs, perms: (state, rollout.exclude("next_obs"),
                                                                             last_obs.clone(), perms))

    def update(state: TensorDict, rollout: TensorDict, perms: torch.Tensor | None = None):
        """All epochs x minibatches of one iteration (`fnrl.accel.staged` picks how the pieces run).

        perms [(K,) E*M, mb]: the minibatch order, `update.minibatch_order(state, device)` by
        default (drawn on the host from the seed and env steps); a caller that captures the
        update in a CUDA graph passes it in, refilled in place before each replay."""
        if perms is None:
            perms = minibatch_order(state, rollout.device or state["env_steps"].device)
        last_obs = rollout["next_obs"][:, -1] if batched else rollout["next_obs"][-1]
        return run(perms.device, state, rollout, last_obs, perms)

    update.minibatch_order = minibatch_order
    return Agent(init=_initializer(config, spec, build, opt), act=act, update=update)


def _optimizer(config: Config):
    """Adam after global-norm clipping, its learning rate stored in the state (sweepable) and,
    with `anneal_lr`, decayed linearly to 0 over the run's gradient steps."""
    n = config.num_steps * config.num_envs
    grad_steps = max(1, config.total_steps // n) * config.update_epochs * config.num_minibatches
    decay = optim.linear_schedule(1.0, 0.0, grad_steps) if config.anneal_lr else None
    return optim.chain(optim.clip_by_global_norm(config.max_grad_norm), optim.scale_by_adam(eps=config.adam_eps),
                       optim.scale_by_stored_learning_rate(config.learning_rate, decay))


def _initializer(config: Config, spec: EnvSpec, build, opt) -> Callable:
    """`init(seed) -> state`: parameters, optimizer moments, env steps, the minibatch seed, the
    sweepable hyperparameters, and the normalizers and KL coefficient the config uses."""
    def init(seed: int) -> TensorDict:
        params = init_params(build, seed)
        hp = {k: torch.tensor(float(getattr(config, k))) for k in SWEEPABLE if k != "learning_rate"}
        state = {"params": params, "opt_state": opt.init(params), "env_steps": torch.zeros((), dtype=torch.int64),
                 "seed": torch.tensor(rng.derive(seed, rng.MINIBATCH), dtype=torch.int64),
                 "hp": TensorDict(hp, batch_size=[])}
        if config.normalize_obs:
            state["obs_rms"] = rms_init(spec.obs_shape)
        if config.normalize_reward:
            state["rew_rms"] = rms_init(())
            state["ret"] = torch.zeros(config.num_envs)
        if config.penalty == "kl":
            state["kl_coef"] = torch.tensor(config.kl_init_coef)
        return TensorDict(state, batch_size=[])

    return init
