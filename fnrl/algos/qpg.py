"""Q-value policy gradients for continuous control: DDPG, TD3, SAC, and a distributional critic.

- DDPG (Lillicrap et al. 2016, arXiv:1509.02971): deterministic actor mu(s) in [-1, 1]
  (tanh output), Gaussian exploration noise, critic Q(s, a), target actor and critic.
- TD3 (Fujimoto et al. 2018, arXiv:1802.09477): twin critics with the clipped double-Q
  target, target-policy smoothing noise, actor and target updates every `policy_delay`
  critic updates.
- SAC (Haarnoja et al. 2018, arXiv:1801.01290, arXiv:1812.05905): tanh-squashed Gaussian
  policy, twin critics with the soft clipped double-Q target, automatic temperature with
  target entropy -|A| (or a fixed alpha), reward scale.
- gSDE for SAC (Raffin et al. 2022, arXiv:2005.05719; `use_sde`): the policy's std is a
  function of the last hidden layer's features, sigma(s) = sqrt(z(s)^2 @ exp(log_std)^2), and
  acting adds z(s) @ (exp(log_std) * E) with a noise matrix E per env held between updates,
  so exploration is smooth along a trajectory (what MountainCarContinuous needs).
- Distributional critic (D4PG, Barth-Maron et al. 2018, arXiv:1804.08617) for DDPG/TD3:
  each critic outputs a categorical distribution over `num_atoms` fixed atoms in
  [v_min, v_max]; the target is the C51 projection of r + discount * z and the loss the
  cross-entropy; the actor maximises the distribution's mean. With twin critics the target
  distribution is, per sample, the one of the target critic with the lower mean.

    agent = qpg.make(qpg.Config(algo="td3"), env.spec)
    state = agent.init(seed=0)
    action, extras, carry = agent.act(state, obs, None, explore=True)   # env units
    state, metrics = agent.update(state, replay_sample)                  # one gradient update

Twin critics are one stacked parameter TensorDict [K, ...] (K = 2, or 1 for DDPG) evaluated
with `torch.func.vmap`; target networks are one TensorDict moved by one `polyak` call. The
update (critic, actor, temperature, targets) is one pure function. TD3's actor/target cadence
is a `switch` (torch.cond) on the update counter tensor `state["updates"]`: one graph, and
the off steps never compute the actor's loss or gradient (~27% cheaper than the on steps,
1.15-1.18x per update against masking the actor step, `benchmarks/probes/td3_delay.md`);
`state["actor_metrics"]` carries the last actor step's metrics for the steps in between.

The policy works in [-1, 1]^D; `act` rescales to the env's bounds (`spec.action_low/high`, or
[-action_scale, action_scale]) and the update maps replayed actions back. n-step returns and
the bootstrap discount (0 only on termination, never on truncation) come from the replay.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import torch
from tensordict import TensorDict
from torch import nn

from fnrl import losses, optim
from fnrl.algos.common import Agent, check_positive, gradient_step, initializing, require_continuous, switch
from fnrl.algos.spec import AlgorithmSpec
from fnrl.distributions import sde_log_std, sde_noise, tanh_normal_mode, tanh_normal_sample
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.nets import Linear, call, layer_init, mlp, parameters
from fnrl.nets.core import user_torso
from fnrl.normalize import rms_init, rms_normalize, rms_update

SWEEPABLE = ("actor_lr", "critic_lr", "alpha_lr", "gamma")
"""Config fields `fnrl train sac --sweep FIELD=v1,v2` may vary across the rows of one vmapped run:
the step sizes are held in the optimizer state (`scale_by_group_learning_rate`) and gamma only in
the replay (each row's buffer computes its own n-step returns), so one update serves all rows."""
ACT_KEYS = (("params", "actor"), "obs_rms", "env_steps", "sde_noise")
"""The state `act` reads (the training loop passes a compiled `act` only these: fewer guards)."""
SPEC = AlgorithmSpec(kind="off_policy", replay="row", act_keys=ACT_KEYS, sweepable=SWEEPABLE)

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""Range of the SAC policy's log standard deviation (CleanRL's / SpinningUp's bounds)."""


@dataclass
class Config:
    """DDPG / TD3 / SAC settings. Defaults learn Pendulum-v1 (SAC, TD3: mean return above -250
    within 20k steps, DDPG within 30k) in a minute or two on two CPU cores: small networks and
    one large-batch update every 4 env steps. `experiments/mujoco.py` holds CleanRL's MuJoCo
    settings (256-256 networks, one update per env step)."""

    env_id: str = "Pendulum-v1"
    """environment id (EnvPool task or registered gymnasium env, or gymnasium's module:Env-v0)"""
    env_kwargs: dict = field(default_factory=dict)
    """keyword arguments of the env's constructor (envpool.make / gymnasium.make), e.g. {"max_episode_steps": 200}"""
    total_steps: int = 20_000
    """total environment steps (all envs together)"""
    num_envs: int = 8
    """parallel environments B"""
    num_steps: int = 1
    """env steps per env per collect"""
    buffer_size: int = 1_000_000
    """replay capacity (transitions)"""
    batch_size: int = 256
    """replay sample size per gradient update"""
    learning_starts: int = 1_000
    """env steps of uniform random actions before the first update"""
    replay_ratio: float = 0.25
    """gradient updates per env step"""
    n_step: int = 1
    """n-step return length"""
    gamma: float = 0.99
    """discount factor"""
    prioritized: bool = False
    """prioritized replay (|TD error| priorities)"""
    priority_alpha: float = 0.6
    """priority exponent"""
    priority_beta: float = 0.4
    """initial importance-sampling exponent (annealed to 1 by the loop)"""
    algo: str = "sac"
    """ddpg, td3 or sac (set by the command name)"""
    num_critics: int = 2
    """critics K in the clipped double-Q minimum (2: TD3/SAC, 1: DDPG)"""
    actor_lr: float = 1e-3
    """actor Adam step size"""
    critic_lr: float = 1e-3
    """critic Adam step size"""
    tau: float = 0.01
    """polyak rate of the target networks"""
    policy_delay: int = 1
    """update the actor (and the targets) every this many critic updates (TD3's d)"""
    exploration_noise: float = 0.1
    """std of the Gaussian action noise of DDPG/TD3, in units of half the action range"""
    policy_noise: float = 0.2
    """std of TD3's target-policy smoothing noise (half-range units; 0 turns it off)"""
    noise_clip: float = 0.5
    """clip of TD3's target-policy smoothing noise"""
    autotune: bool = True
    """SAC: learn the temperature alpha towards target_entropy"""
    alpha: float = 0.2
    """SAC: the fixed temperature when autotune is off"""
    alpha_init: float = 1.0
    """SAC: the initial temperature when autotune is on"""
    alpha_lr: float = 1e-3
    """SAC: temperature Adam step size"""
    target_entropy: Optional[float] = None
    """SAC: target policy entropy (None: -|A|)"""
    use_sde: bool = False
    """SAC: generalized state-dependent exploration (gSDE, arXiv:2005.05719): noise matrices per env, drawn anew
    after every update (stable-baselines3's use_sde with sde_sample_freq -1), in place of independent noise per step"""
    sde_log_std_init: float = -3.0
    """SAC with gSDE: the initial entries of the log-std matrix [last hidden size, action dims]"""
    reward_scale: float = 1.0
    """multiply rewards by this in the critic target"""
    distributional: bool = False
    """DDPG/TD3: categorical critic over a fixed support (D4PG)"""
    num_atoms: int = 51
    """atoms of the distributional critic"""
    v_min: float = -150.0
    """lowest atom (in scaled-reward return units)"""
    v_max: float = 150.0
    """highest atom"""
    normalize_obs: bool = False
    """running mean/std observation normalization (statistics of replayed observations)"""
    action_scale: Optional[float] = None
    """actions span [-action_scale, action_scale] (needed for envs with unbounded actions)"""
    hidden: tuple[int, ...] = (64, 64)
    """MLP hidden sizes of actor and critics"""


VARIANTS: dict[str, dict] = {
    "ddpg": {"algo": "ddpg", "num_critics": 1, "policy_noise": 0.0, "total_steps": 30_000},
    "td3": {"algo": "td3", "num_critics": 2, "policy_delay": 2},
    "sac": {"algo": "sac", "num_critics": 2},
}


def validate(config: Config, spec: EnvSpec | None = None) -> None:
    """Raise ConfigError for settings that cannot work, before any training."""
    name = config.algo
    if name not in ("ddpg", "td3", "sac"):
        raise ConfigError(f"--algo must be ddpg, td3 or sac, got {name!r}")
    check_positive(config, "total_steps", "num_envs", "num_steps", "buffer_size", "batch_size", "n_step",
                   "num_critics", "actor_lr", "critic_lr", "alpha_lr", "policy_delay", "reward_scale",
                   "action_scale", "num_atoms")
    if not 0.0 < config.tau <= 1.0:
        raise ConfigError(f"--tau must be in (0, 1], got {config.tau}")
    if not 0.0 <= config.gamma <= 1.0:
        raise ConfigError(f"--gamma must be in [0, 1], got {config.gamma}")
    if min(config.exploration_noise, config.policy_noise, config.noise_clip) < 0:
        raise ConfigError("--exploration-noise, --policy-noise and --noise-clip must be >= 0")
    if name == "sac" and not config.autotune and config.alpha < 0:
        raise ConfigError(f"--alpha must be >= 0, got {config.alpha}")
    if name == "sac" and config.autotune and config.alpha_init <= 0:
        raise ConfigError(f"--alpha-init must be positive, got {config.alpha_init}")
    if config.use_sde and name != "sac":
        raise ConfigError(f"--use-sde is for sac (its stochastic policy), not {name}")
    if config.distributional:
        if name == "sac":
            raise ConfigError("--distributional is for ddpg and td3 (D4PG-style critic), not sac")
        if config.num_atoms < 2 or not config.v_min < config.v_max:
            raise ConfigError(f"the distributional critic needs --num-atoms >= 2 and --v-min < --v-max, got "
                              f"{config.num_atoms}, {config.v_min}, {config.v_max}")
    if spec is None:
        return
    require_continuous(name, spec)
    if isinstance(spec.obs_shape, dict) or len(spec.obs_shape) != 1:
        raise ConfigError(f"{name} takes vector observations, but {spec.env_id} has observations of shape "
                          f"{spec.obs_shape}")
    if config.action_scale is None and not (torch.isfinite(spec.action_low).all()
                                            and torch.isfinite(spec.action_high).all()):
        raise ConfigError(f"{spec.env_id} has unbounded actions (low {spec.action_low.tolist()}, high "
                          f"{spec.action_high.tolist()}); give --action-scale S to act in [-S, S]")


# ---------------------------------------------------------------------------
# networks
# ---------------------------------------------------------------------------


class Critic(nn.Module):
    """Q(s, a): an MLP on [obs, action] with `out` outputs (1: a value [*], else logits [*, out]);
    with `torso` (module, feature size), on [torso(obs), action]."""

    def __init__(self, obs_size: int, action_dim: int, hidden, out: int, torso=None):
        super().__init__()
        self.torso, obs_size = (nn.Identity(), obs_size) if torso is None else torso
        self.body = mlp(obs_size + action_dim, out, hidden, "relu", out_gain=1.0)
        self.scalar = out == 1

    def forward(self, obs, action):
        y = self.body(torch.cat([self.torso(obs), action], dim=-1))
        return y.squeeze(-1) if self.scalar else y


class SdeActor(nn.Module):
    """gSDE's actor: features z = body(obs) [*, L], the mean head(z) [*, D] clipped to [-2, 2]
    (stable-baselines3's clip, which keeps the mean where tanh has a gradient), and the log-std
    matrix [L, D] as a parameter. forward(obs) -> (mean, z)."""

    def __init__(self, body: nn.Module, latent_dim: int, action_dim: int, log_std_init: float):
        super().__init__()
        self.body = body
        self.mean = layer_init(Linear(latent_dim, action_dim), 0.01)
        self.log_std = nn.Parameter(torch.full((latent_dim, action_dim), float(log_std_init)))

    def forward(self, obs):
        z = self.body(obs)
        return self.mean(z).clamp(-2.0, 2.0), z


class Networks(NamedTuple):
    """The modules and the pure functions over their parameters.

    init(seed) -> TensorDict {"actor": ..., "critic": stacked [K, ...]}
    mode(actor_params, obs) -> action [N, D] in [-1, 1] (the deterministic / greedy action)
    sample(actor_params, obs) -> (action [N, D] in (-1, 1), log pi [N])   (SAC only)
    explore(actor_params, obs, noise) -> action [N, D]: gSDE's action with noise matrices [N, L, D]
    critics(critic_params [K], obs, action) -> [K, N] values, or [K, N, atoms] logits
    """

    actor: nn.Module
    critic: nn.Module
    init: Callable
    mode: Callable
    sample: Callable
    critics: Callable
    explore: Callable


def _log_std(raw: torch.Tensor) -> torch.Tensor:
    """Squash an unbounded output into [LOG_STD_MIN, LOG_STD_MAX] with tanh."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1.0)


def _actor(config: Config, obs_size: int, d: int, torso) -> nn.Module:
    """The actor MLP on the observation (or on `torso`, a (module, feature size) pair): the action
    [*, D] (DDPG/TD3), mean and raw log-std [*, 2D] (SAC), or `SdeActor` (SAC with gSDE)."""
    features = obs_size if torso is None else torso[1]
    if config.use_sde:
        body = mlp(features, None, config.hidden, "relu")
        latent = config.hidden[-1] if config.hidden else features
        return SdeActor(body if torso is None else nn.Sequential(torso[0], body), latent, d, config.sde_log_std_init)
    head = mlp(features, 2 * d if config.algo == "sac" else d, config.hidden, "relu", out_gain=0.01)
    return head if torso is None else nn.Sequential(torso[0], head)


def networks(config: Config, spec: EnvSpec, network=None) -> Networks:
    """Actor and K critics for `spec` (vector observations, D-dim continuous actions); with
    `network` (`fnrl.nets.core.user_torso`), the actor and each critic on a torso of their own
    made from it, in place of the raw observation."""
    obs_size, d = spec.obs_size, spec.action_dim
    stochastic = config.algo == "sac"
    critic_out = config.num_atoms if config.distributional else 1

    def torso():
        return None if network is None else user_torso(network, spec.obs_shape)

    def build_actor():
        return _actor(config, obs_size, d, torso())

    def build_critic():
        return Critic(obs_size, d, config.hidden, critic_out, torso())

    actor, critic = build_actor(), build_critic()

    def init(seed: int) -> TensorDict:
        with initializing(seed):
            actor_params = parameters(build_actor())
            critic_params = torch.stack([parameters(build_critic()) for _ in range(config.num_critics)])
        return TensorDict({"actor": actor_params, "critic": critic_params}, batch_size=[])

    def gaussian(actor_params, obs):
        if config.use_sde:
            mean, z = call(actor, actor_params, obs)
            return mean, sde_log_std(z, actor_params["log_std"])
        mean, raw = call(actor, actor_params, obs).chunk(2, dim=-1)
        return mean, _log_std(raw)

    def mode(actor_params, obs):
        if config.use_sde:   # the mean alone: no std to compute
            return tanh_normal_mode(call(actor, actor_params, obs)[0])
        if stochastic:
            return tanh_normal_mode(gaussian(actor_params, obs)[0])
        return torch.tanh(call(actor, actor_params, obs))

    def sample(actor_params, obs):
        return tanh_normal_sample(*gaussian(actor_params, obs))

    def explore(actor_params, obs, noise):
        mean, z = call(actor, actor_params, obs)
        n = z.shape[0]   # a sub-batch of envs (a sampler worker's) takes the first n matrices; more rows share one
        noise = noise[:n] if n <= noise.shape[0] else noise[0]
        return torch.tanh(mean + sde_noise(z, actor_params["log_std"], noise))

    def critics(critic_params, obs, action):
        flat = critic_params.flatten_keys(".").to_dict()
        return torch.func.vmap(lambda p: torch.func.functional_call(critic, p, (obs, action)))(flat)

    return Networks(actor, critic, init, mode, sample, critics, explore)


# ---------------------------------------------------------------------------
# pieces of the update
# ---------------------------------------------------------------------------


def _keep(new: TensorDict, old: TensorDict, groups: list[str]) -> TensorDict:
    """`new`, except the leaves under a key named in `groups`, which are `old`'s (the same
    tensors). Works on parameters and on optimizer state alike."""
    return new.apply(lambda key, n, o: o if any(g in key for g in groups) else n, old, named=True, nested_keys=True)


def scale_by_group_learning_rate(rates: dict[str, float]) -> optim.GradientTransformation:
    """out[k] = -rate_k * g[k] for each top-level group k of the parameters.

    Lets one Adam (`chain(scale_by_adam(), scale_by_group_learning_rate(...))`) move actor,
    critics and temperature with their own step sizes, as separate torch.optim.Adam's would.
    The rates are 0-d tensors in the state ({k: rate_k} for the groups present in the
    parameters, in their dtype: `optim.hyperparameter`), so stacked states may hold different
    rates (fnrl.seeds sweeps).
    """

    def init(params):
        return TensorDict({k: optim.hyperparameter(rates[k], params.get(k)) for k in params.keys()}, batch_size=[])

    def update(grads, state, params=None):
        return TensorDict({k: grads.get(k).mul(-state[k]) for k in grads.keys()}, batch_size=[]), state

    def update_leaves(grads, state, params, layout):
        return [g.mul(-state[key[0]]) for g, key in zip(grads, layout.keys)], state

    return optim.GradientTransformation(init, update, update_leaves)


def _categorical_mean(logits: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """E[Z] = sum_j softmax(logits)_j z_j; logits [..., M], support [M] -> [...]."""
    return (torch.softmax(logits, dim=-1) * support.to(logits.device)).sum(-1)


def _select_lowest_mean(logits: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Probabilities of the critic with the lowest mean, per sample: [K, N, M] -> [N, M]."""
    probs = torch.softmax(logits, dim=-1)
    k = _categorical_mean(logits, support).argmin(0)  # [N]
    return probs.gather(0, k[None, :, None].expand(1, *probs.shape[1:])).squeeze(0)


def _action_transforms(config: Config, spec: EnvSpec):
    """(to_env, to_unit): the policy's [-1, 1] actions to env units (clipped to the bounds) and back."""
    d = spec.action_dim
    if config.action_scale is not None:
        low, high = torch.full((d,), -float(config.action_scale)), torch.full((d,), float(config.action_scale))
    else:
        low, high = spec.action_low.float(), spec.action_high.float()
    center, half = (high + low) / 2, (high - low) / 2
    if bool((center == center[0]).all() and (half == half[0]).all()):
        # the same bounds in every dimension (MuJoCo's, Pendulum's): Python numbers, which a rollout
        # traced as one graph (fnrl.samplers.graph) can hold, where it cannot close over a tensor
        center, half = float(center[0]), float(half[0])

    def bounds(a):
        """(center, half range) of the action space: numbers, or [D] tensors on `a`'s device."""
        return (center, half) if isinstance(center, float) else (center.to(a.device), half.to(a.device))

    def to_env(a):
        """[-1, 1] -> env units, clipped to the bounds."""
        c, h = bounds(a)
        return (c + h * a).clamp(c - h, c + h)

    def to_unit(a):
        """env units -> [-1, 1]."""
        c, h = bounds(a)
        return ((a - c) / h).clamp(-1.0, 1.0)

    return to_env, to_unit


def _losses(config: Config, nets, support, target_entropy: float):
    """(critic_target, critics_only_loss, loss) of DDPG / TD3 / SAC with the networks `nets`
    (`support`: the distributional critic's atoms, or None)."""
    sac = config.algo == "sac"

    def critic_target(params, target, next_obs, reward, discount, alpha):
        """The detached bootstrap target: y [N] (scalar critics) or target probabilities [N, M]."""
        if sac:
            next_action, next_logp = nets.sample(params["actor"], next_obs)
        else:
            next_action = nets.mode(target["actor"], next_obs)
            if config.algo == "td3" and config.policy_noise > 0:
                next_action = losses.td3_target_action(next_action, config.policy_noise, config.noise_clip, -1.0, 1.0)
            next_logp = None
        next_q = nets.critics(target["critic"], next_obs, next_action)
        if config.distributional:
            z = support.to(next_q.device)
            return losses.categorical_q_target(reward, discount, _select_lowest_mean(next_q, z), z)
        return losses.twin_q_target(reward, discount, next_q[0], next_q[-1], next_logp, alpha)

    def critic_loss(critic_params, obs, action, target, weight):
        """Importance-weighted TD (or cross-entropy) loss summed over the K critics."""
        q = nets.critics(critic_params, obs, action)  # [K, N] or [K, N, M]
        if config.distributional:
            per_critic = losses.categorical_cross_entropy(q, target.expand_as(q))
            q_mean = _categorical_mean(q, support)
            priority = per_critic.mean(0)
        else:
            per_critic = losses.squared_loss(target - q)
            q_mean = q
            priority = (target - q).abs().mean(0)
        return (weight * per_critic.sum(0)).mean(), {"q_mean": q_mean.mean(), "priority": priority}

    def actor_loss(actor_params, obs, critic_params, alpha):
        """DPG loss -Q_1(s, mu(s)) (DDPG/TD3) or the SAC loss alpha log pi - min_k Q_k."""
        if sac:
            action, logp = nets.sample(actor_params, obs)
            q = nets.critics(critic_params, obs, action).min(0).values
            return losses.sac_actor_loss(logp, q, alpha).mean(), logp
        q = call(nets.critic, critic_params[0], obs, nets.mode(actor_params, obs))
        if config.distributional:
            q = _categorical_mean(q, support)
        return losses.dpg_loss(q).mean(), None

    def critics_only_loss(params, obs, action, target, weight, alpha):
        """The critics' TD (or cross-entropy) loss alone: the off steps of a delayed update,
        where the actor's (and temperature's) gradients are zero and never computed."""
        l_critic, metrics = critic_loss(params["critic"], obs, action, target, weight)
        metrics = {k: v.detach() for k, v in metrics.items()}
        metrics["loss/critic"] = l_critic.detach()
        return l_critic, metrics

    def loss(params, obs, action, target, weight, alpha):
        """critic + actor (+ temperature) loss; each term moves only its own parameters."""
        total, metrics = critics_only_loss(params, obs, action, target, weight, alpha)
        l_actor, logp = actor_loss(params["actor"], obs, params["critic"].detach(), alpha)
        metrics["loss/actor"] = l_actor.detach()
        total = total + l_actor
        if sac:
            metrics["entropy"] = -logp.detach().mean()
        if sac and config.autotune:
            l_alpha = losses.sac_temperature_loss(params["log_alpha"][0], logp, target_entropy).mean()
            metrics["loss/alpha"] = l_alpha.detach()
            total = total + l_alpha
        return total, metrics

    return critic_target, critics_only_loss, loss


def make(config: Config, spec: EnvSpec, network=None) -> Agent:
    """Bind DDPG / TD3 / SAC to an environment: returns `Agent(init, act, update)`.

    network: a torso of your own (an nn.Module, a factory `factory(obs_shape) -> (module,
        out_dim)`, or "module:name"; `fnrl.nets.core.user_torso`) under the actor and under
        each critic, each with parameters of its own; default: none (the MLPs take the
        observation).
    """
    validate(config, spec)
    nets = networks(config, spec, network)
    sac = config.algo == "sac"
    d = spec.action_dim
    to_env, to_unit = _action_transforms(config, spec)
    target_entropy = -float(d) if config.target_entropy is None else float(config.target_entropy)
    support = torch.linspace(config.v_min, config.v_max, config.num_atoms) if config.distributional else None
    target_keys = ("critic",) if sac else ("actor", "critic")
    delayed = config.policy_delay > 1
    # what only the actor step computes (actor, and SAC's temperature, move on the policy_delay cadence)
    actor_metrics = ("loss/actor", *(("entropy",) if sac else ()), *(("loss/alpha",) if sac and config.autotune else ()))
    rates = {"actor": config.actor_lr, "critic": config.critic_lr, "log_alpha": config.alpha_lr}
    opt = optim.chain(optim.scale_by_adam(), scale_by_group_learning_rate(rates))
    critic_target, critics_only_loss, loss = _losses(config, nets, support, target_entropy)

    def observe(state, obs):
        return rms_normalize(state["obs_rms"], obs) if config.normalize_obs else obs

    def temperature(params):
        if not sac:
            return 0.0
        return params["log_alpha"][0].exp().detach() if config.autotune else config.alpha

    def act(state, obs, carry, explore: bool = True):
        obs_n = observe(state, obs)
        actor_params = state["params"]["actor"]
        if not explore:
            return to_env(nets.mode(actor_params, obs_n)), {}, carry
        return to_env(_behaviour_action(config, nets, state, obs_n)), {}, carry

    def update(state: TensorDict, batch: TensorDict):
        """One gradient update of critics, actor (every policy_delay-th) and temperature, then targets.

        One loss, one gradient, one Adam over {actor, critic, log_alpha} (own step sizes;
        the actor's loss sees the critics before this step, as in rlpyt), one polyak step.
        With policy_delay > 1 (TD3) a `switch` (torch.cond) on the update counter picks the
        step: on the cadence the full one; off it the critics' alone, which never computes the
        actor's (or the temperature's) loss or gradient and keeps the actor, log alpha, their
        Adam moments and the targets exactly as they were (Adam's step count, shared, still
        advances).
        """
        params, target = state["params"], state["target"]
        obs, next_obs = observe(state, batch["obs"]), observe(state, batch["next_obs"])
        alpha = temperature(params)
        y = critic_target(params, target, next_obs, config.reward_scale * batch["reward"], batch["discount"], alpha)
        args = (obs, to_unit(batch["action"]), y, batch["weight"], alpha)
        if delayed:
            on = (state["updates"] % config.policy_delay) == 0

            keys = ("q_mean", "priority", "loss/critic", "loss", *actor_metrics)

            def actor_step(params, opt_state):
                new_params, new_opt, m = gradient_step(loss, params, opt, opt_state, *args)
                return (new_params, new_opt), tuple(m[k] for k in keys)

            def critics_step(params, opt_state):
                new_params, new_opt, m = gradient_step(critics_only_loss, params, opt, opt_state, *args)
                m.update(state["actor_metrics"].items())
                frozen = [group for group in params.keys() if group != "critic"]
                return ((_keep(new_params, params, frozen), _keep(new_opt, opt_state, frozen)),
                        tuple(m[k] for k in keys))

            (new_params, new_opt), outs = switch(on, actor_step, critics_step, (params, state["opt_state"]))
            m = dict(zip(keys, outs))
            tau = on.to(torch.float32) * config.tau
        else:
            new_params, new_opt, m = gradient_step(loss, params, opt, state["opt_state"], *args)
            tau = config.tau
        new_state = state.copy()
        new_state["params"], new_state["opt_state"] = new_params, new_opt
        new_state["target"] = optim.polyak(target, new_params.select(*target_keys), tau)
        new_state["updates"] = state["updates"] + 1
        if delayed:
            new_state["actor_metrics"] = TensorDict({k: m[k] for k in actor_metrics}, batch_size=[])
        if config.normalize_obs:
            new_state["obs_rms"] = rms_update(state["obs_rms"], batch["obs"])
        if config.use_sde:   # the next collect explores with fresh matrices
            new_state["sde_noise"] = torch.randn_like(state["sde_noise"])
        priority = m.pop("priority")
        del m["loss"]
        if config.prioritized:
            m["priority"] = priority
        if sac:
            m["alpha"] = torch.as_tensor(alpha, dtype=torch.float32)
        return new_state, TensorDict(m, batch_size=[])

    return Agent(init=_initializer(config, spec, nets, opt, target_keys, actor_metrics), act=act, update=update)


def _behaviour_action(config: Config, nets: Networks, state: TensorDict, obs: torch.Tensor) -> torch.Tensor:
    """The exploring action in [-1, 1]: uniform before `learning_starts`, then gSDE's, a sample
    of SAC's policy, or DDPG's / TD3's action plus Gaussian noise."""
    actor_params = state["params"]["actor"]
    if config.use_sde:
        a = nets.explore(actor_params, obs, state["sde_noise"])
    elif config.algo == "sac":
        a = nets.sample(actor_params, obs)[0]
    else:
        a = nets.mode(actor_params, obs)
        a = (a + config.exploration_noise * torch.randn_like(a)).clamp(-1.0, 1.0)
    warmup = state["env_steps"] < config.learning_starts
    return torch.where(warmup, 2.0 * torch.rand_like(a) - 1.0, a)


def _initializer(config: Config, spec: EnvSpec, nets, opt, target_keys: tuple, actor_metrics: tuple) -> Callable:
    """`init(seed) -> state`: parameters (SAC's log temperature where it is tuned), the target
    copies of `target_keys`, optimizer moments, counters, the last actor step's metrics (TD3's
    delayed policy) and the observation normalizer the config uses."""
    sac = config.algo == "sac"

    def init(seed: int) -> TensorDict:
        params = nets.init(seed)
        if sac and config.autotune:
            # shape [1], not 0-d: optim's float64 bias corrections would promote a 0-d float32 leaf
            params["log_alpha"] = torch.full((1,), math.log(config.alpha_init))
        state = {
            "params": params,
            "target": params.select(*target_keys).clone(),
            "opt_state": opt.init(params),
            "env_steps": torch.zeros((), dtype=torch.int64),
            "updates": torch.zeros((), dtype=torch.int64),
        }
        if config.policy_delay > 1:   # the last actor step's metrics, reported by the steps in between
            state["actor_metrics"] = TensorDict({k: torch.zeros(()) for k in actor_metrics}, batch_size=[])
        if config.normalize_obs:
            state["obs_rms"] = rms_init(spec.obs_shape)
        if config.use_sde:   # one noise matrix per env
            with initializing(seed, 1):
                state["sde_noise"] = torch.randn((config.num_envs, *params["actor"]["log_std"].shape))
        return TensorDict(state, batch_size=[])

    return init
