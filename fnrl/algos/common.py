"""Pieces every algorithm file composes: action distributions, masked means, one
gradient step, and option validation. No algorithm-specific math lives here."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase

from fnrl import distributions as D
from fnrl import rng
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.optim import Layout, apply_leaf_updates, apply_updates, plain_eager
from fnrl.tensordicts import gather_rows


class ActionDist(NamedTuple):
    """The policy distribution of an action space, as pure functions of `dist`.

    `dist` is a tuple: `(logits,)` for discrete actions, `(mean, log_std)` for
    continuous ones. Each function broadcasts over leading dims.
    """

    sample: Callable
    log_prob: Callable  # (*dist, action) -> [...]
    entropy: Callable
    mode: Callable
    kl: Callable  # (dist_p, dist_q) -> [...]


CATEGORICAL = ActionDist(
    sample=lambda logits: D.categorical_sample(logits),
    log_prob=lambda logits, a: D.categorical_log_prob(logits, a),
    entropy=lambda logits: D.categorical_entropy(logits),
    mode=lambda logits: D.categorical_mode(logits),
    kl=lambda p, q: D.categorical_kl(p[0], q[0]),
)

GAUSSIAN = ActionDist(
    sample=lambda mean, log_std: D.normal_sample(mean, log_std),
    log_prob=lambda mean, log_std, a: D.normal_log_prob(mean, log_std, a),
    entropy=lambda mean, log_std: D.normal_entropy(log_std.expand_as(mean)),
    mode=lambda mean, log_std: D.normal_mode(mean),
    kl=lambda p, q: D.normal_kl(p[0], p[1], q[0], q[1]),
)


def multi_categorical(nvec: tuple) -> ActionDist:
    """Independent categoricals over the parts of a multi-discrete action (`EnvSpec.action_nvec`):
    `dist` is `(logits [..., sum(nvec)],)`, actions int64 [..., K]."""
    nvec = tuple(int(n) for n in nvec)
    return ActionDist(
        sample=lambda logits: D.multi_categorical_sample(logits, nvec),
        log_prob=lambda logits, a: D.multi_categorical_log_prob(logits, nvec, a),
        entropy=lambda logits: D.multi_categorical_entropy(logits, nvec),
        mode=lambda logits: D.multi_categorical_mode(logits, nvec),
        kl=lambda p, q: D.multi_categorical_kl(p[0], q[0], nvec),
    )


def action_dist(spec: EnvSpec) -> ActionDist:
    """The policy distribution of the env's actions: categorical, independent categoricals
    (multi-discrete) or a diagonal Gaussian."""
    if spec.multi_discrete:
        return multi_categorical(spec.action_nvec)
    return CATEGORICAL if spec.discrete else GAUSSIAN


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over the entries where `mask` is True (0 if there are none)."""
    return masked_means(mask, x.dtype)(x)


def masked_means(mask: torch.Tensor, dtype: torch.dtype) -> Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]:
    """`mean(x)`: `masked_mean(x, mask)` for any `x` of `dtype`, the mask's weights and count made
    once; `mean(x, y, ...)`: the tuple of their means, for tensors of the mask's shape. In plain
    eager mode that is one reduction of their stack (a loss's metrics: a few ops instead of three
    per mean); traced, one mean each (Inductor fuses them, and a scan's outputs must not be views
    of one tensor).

    mean(x) = sum_i x_i m_i / max(1, sum_i m_i),   m = mask as 0 / 1."""
    m = mask.to(dtype)
    count = m.sum().clamp(min=1.0)

    def mean(x, *more):
        if not more:
            return (x * m).sum() / count
        if not plain_eager():
            return tuple((t * m).sum() / count for t in (x, *more))
        return ((torch.stack((x, *more)) * m).flatten(1).sum(1) / count).unbind(0)
    return mean


def take_rows(batch: TensorDict, index: torch.Tensor) -> TensorDict:
    """`batch[index]` for a 1-D index tensor; in plain eager mode through
    `fnrl.tensordicts.gather_rows` where it applies (the same tensors, fewer TensorDict checks)."""
    rows = gather_rows(batch, index) if plain_eager() else None
    return batch[index] if rows is None else rows


def gradient_step(loss_fn: Callable, params: TensorDict, opt, opt_state: TensorDict, *args):
    """loss -> grad -> optimizer -> new params, as one pure step.

    `loss_fn(params, *args) -> (loss, metrics)`. Returns
    `(params, opt_state, metrics)` with `metrics["loss"]` added. The gradients pass
    through the reducer of `reducing_gradients` (if one is open) before the optimizer.

    Where the parameters have a `fnrl.optim.Layout` and the optimizer has `update_leaves`, the
    step runs on the list of leaves (the same numbers): eagerly through plain autograd and
    `torch._foreach_*` calls, traced through `torch.func.grad_and_value` of the list and per-leaf
    ops, which TorchDynamo traces faster than the TensorDict pytrees (`docs/performance.md`).
    """
    on_leaves = getattr(opt, "update_leaves", None) is not None and _gradient_reducer is None
    layout = Layout.of(params) if on_leaves else None
    if layout is not None:
        return _leaf_step(loss_fn, params, layout, opt, opt_state, *args)
    if plain_eager():
        grads, (loss, metrics) = _autograd_grad_and_value(loss_fn, params, *args)
    else:
        grads, (loss, metrics) = torch.func.grad_and_value(loss_fn, has_aux=True)(params, *args)
    if _gradient_reducer is not None:   # data-parallel training (fnrl.distributed): mean over ranks
        grads = _gradient_reducer(grads)
    updates, opt_state = opt.update(grads, opt_state, params)
    return apply_updates(params, updates), opt_state, dict(metrics, loss=loss.detach())


def _leaf_step(loss_fn: Callable, params: TensorDict, layout, opt, opt_state: TensorDict, *args):
    """`gradient_step` on the parameters as a list (`fnrl.optim.Layout`), the optimizer's
    `update_leaves` on the gradients' list; in plain eager mode, for an optimizer with
    `apply_leaves` (Adam, fused), the same numbers up to float rounding."""
    values = layout.leaves(params)
    if plain_eager():
        with torch.enable_grad():
            leaves = [p.detach().requires_grad_() for p in values]
            loss, metrics = loss_fn(layout.tree(leaves), *args)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(values, grads)]
        if getattr(opt, "apply_leaves", None) is not None:   # the whole step fused (`fnrl.optim.chain`)
            new_values, opt_state = opt.apply_leaves(grads, opt_state, values, layout)
            return layout.tree(new_values), opt_state, dict(metrics, loss=loss.detach())
    else:
        grads, (loss, metrics) = torch.func.grad_and_value(
            lambda leaves, *rest: loss_fn(layout.tree(leaves), *rest), has_aux=True)(values, *args)
    updates, opt_state = opt.update_leaves(list(grads), opt_state, values, layout)
    return layout.tree(apply_leaf_updates(values, updates)), opt_state, dict(metrics, loss=loss.detach())


class _Leaves:
    """A tuple of TensorDicts as a flat tuple of tensor leaves and back, for the higher-order
    ops (scan, cond) whose operands and results must be tensors. Every key, nested
    TensorDicts too (even empty ones: a stateless optimizer stage) with their own batch sizes
    (stacked twin critics), in the order the TensorDicts hold them, so the rebuilt ones match
    them exactly."""

    def __init__(self, tds: tuple[TensorDict, ...]):
        def as_tuple(k):
            return (k,) if isinstance(k, str) else k

        # (key path, batch size of a nested TensorDict or None for a tensor leaf)
        self.entries = [[(as_tuple(k), v.batch_size if isinstance(v, TensorDictBase) else None)
                         for k, v in td.items(include_nested=True)] for td in tds]
        self.batch_sizes = [td.batch_size for td in tds]

    def flatten(self, tds, clone: bool = False) -> tuple[torch.Tensor, ...]:
        """clone: copies, for results that must not alias an operand (a leaf passed through)."""
        return tuple(td.get(k).clone() if clone else td.get(k)
                     for keys, td in zip(self.entries, tds) for k, node in keys if node is None)

    def unflatten(self, leaves) -> tuple[TensorDict, ...]:
        out, i = [], 0
        for keys, batch_size in zip(self.entries, self.batch_sizes):
            tree, sizes = {}, {}
            for k, node_size in keys:
                parent = tree
                for part in k[:-1]:
                    parent = parent[part]
                if node_size is not None:
                    parent[k[-1]] = {}
                    sizes[k] = node_size
                else:
                    parent[k[-1]] = leaves[i]
                    i += 1
            out.append(_as_tensordict(tree, batch_size, sizes, ()))
        return tuple(out)


def _as_tensordict(tree: dict, batch_size, sizes: dict, path: tuple) -> TensorDict:
    """Nested dicts of tensors -> nested TensorDicts, node `path + (k,)` of batch size `sizes[...]`."""
    return TensorDict({k: _as_tensordict(v, sizes[path + (k,)], sizes, path + (k,)) if isinstance(v, dict) else v
                       for k, v in tree.items()}, batch_size=batch_size)


def scan_steps(step: Callable, carry: tuple[TensorDict, ...], xs: torch.Tensor):
    """`carry, out_i = step(carry, xs[i])` for i = 0, 1, ...: (final carry, outs stacked [len(xs)]).

    `carry` is a tuple of TensorDicts (parameters, optimizer state), `out_i` a dict of
    tensors (metrics). Inside torch.compile this is one `scan` (torch's prototype
    higher-order op): `step` is traced and compiled once, and all the steps run inside one
    compiled call, with neither Python nor guard checks between them. The TensorDicts cross
    the scan as tuples of tensor leaves. Outside compile it is a Python loop.
    """
    if not torch.compiler.is_compiling():
        outs = []
        for x in xs.unbind(0):
            carry, out = step(carry, x)
            outs.append(out)
        return carry, {k: torch.stack([o[k] for o in outs]) for k in outs[0]}
    from torch._higher_order_ops.scan import scan

    leaves = _Leaves(carry)

    def body(flat, x):
        new_carry, out = step(leaves.unflatten(flat), x)
        # clone: a leaf the step passes through unchanged (a stored rate) must not alias its input
        return leaves.flatten(new_carry, clone=True), dict(out)

    flat, outs = scan(body, leaves.flatten(carry), xs)
    return leaves.unflatten(flat), outs


def switch(pred: torch.Tensor, on_true: Callable, on_false: Callable, carry: tuple[TensorDict, ...]):
    """`on_true(*carry)` if the 0-d bool `pred` else `on_false(*carry)`, each returning
    (new carry, a tuple of tensors) of the same structure, shapes and dtypes.

    One `torch.cond` (torch's higher-order op) inside a compiled graph, so only the taken
    branch runs, without a Python branch on a tensor or a recompile. In plain eager mode a
    Python `if` picks the branch: an eager torch.cond traces both branches through TorchDynamo
    for every new pair of functions (20-40 s for TD3's update on this CPU), and eagerly a sync
    costs nothing. Under vmap (seeds), where torch.cond with gradients in its branches does
    not trace, both branches run and each row takes its own with `torch.where`; so they do on
    a GPU, where Inductor's cond reads the predicate on the host: a sync per call, which also
    forbids capturing the step in a CUDA graph (`fnrl.accel.cudagraphs`). The TensorDicts cross as
    leaves, in one flat tuple with the outputs.
    """
    if plain_eager():
        new_carry, outs = (on_true if bool(pred) else on_false)(*carry)
        return new_carry, tuple(outs)
    leaves = _Leaves(carry)

    def branch(fn):
        def run(*flat):
            new_carry, outs = fn(*leaves.unflatten(flat))
            # results may alias neither an operand (a leaf passed through) nor each other (two
            # detached views of one loss): such leaves, and the small outputs, are copies
            return (*(x.clone() if any(x is o for o in flat) else x for x in leaves.flatten(new_carry)),
                    *(x.clone() for x in outs))
        return run

    operands = leaves.flatten(carry)
    if takes_both_branches(pred):
        taken, other = branch(on_true)(*operands), branch(on_false)(*operands)
        results = tuple(torch.where(pred, t, f) for t, f in zip(taken, other))
    else:
        results = torch.cond(pred, branch(on_true), branch(on_false), operands)
    n = len(operands)
    return leaves.unflatten(results[:n]), tuple(results[n:])


def takes_both_branches(pred: torch.Tensor) -> bool:
    """Whether `switch` runs both branches and picks with `torch.where` (see `switch`): under
    vmap, eagerly inside a torch.func transform, and on a GPU."""
    return torch._C._functorch.is_batchedtensor(pred) or _eager_under_transform() or pred.is_cuda


_gradient_reducer: Callable | None = None


@contextlib.contextmanager
def reducing_gradients(reducer: Callable | None):
    """While open, every `gradient_step` applies `reducer(grads) -> grads` between the gradient and
    the optimizer (None: no reduction); on exit the reducer before it is back. A data-parallel
    rank (`fnrl.distributed.data_parallel.ProcessGroupWorld`) holds its all-reduce mean open for
    its whole run, so every algorithm trains data-parallel without a change to its file. Open it
    before the update is compiled (a compiled update that ran without it recompiles once)."""
    global _gradient_reducer
    before, _gradient_reducer = _gradient_reducer, reducer
    try:
        yield
    finally:
        _gradient_reducer = before


def _eager_under_transform() -> bool:
    """True outside torch.compile, inside a torch.func transform (vmap, grad)."""
    return not torch.compiler.is_compiling() and torch._C._functorch.peek_interpreter_stack() is not None


def _autograd_grad_and_value(loss_fn: Callable, params: TensorDict, *args):
    """`torch.func.grad_and_value(loss_fn, has_aux=True)` through plain autograd: the same
    numbers, about 3x faster in eager mode for long op-by-op graphs (recurrent unrolls)."""
    with torch.enable_grad():
        leaves = params.apply(lambda p: p.detach().requires_grad_(p.is_floating_point()))
        loss, metrics = loss_fn(leaves, *args)
        keys = [k for k, p in leaves.items(include_nested=True, leaves_only=True) if p.requires_grad]
        grads = torch.autograd.grad(loss, [leaves[k] for k in keys], allow_unused=True)
    out = leaves.apply(lambda p: torch.zeros_like(p).detach())
    for k, g in zip(keys, grads):
        if g is not None:
            out[k] = g
    return out, (loss.detach(), metrics)


def require_discrete(name: str, spec: EnvSpec) -> None:
    if spec.multi_discrete:
        raise ConfigError(f"{name} needs one discrete action, but {spec.env_id}'s actions have "
                          f"{len(spec.action_nvec)} discrete parts {list(spec.action_nvec)}; use ppo, a2c or impala")
    if not spec.discrete:
        raise ConfigError(f"{name} needs a discrete action space, but {spec.env_id} has continuous actions "
                          f"{spec.action_shape}; use sac, td3, ddpg or ppo")


def require_continuous(name: str, spec: EnvSpec) -> None:
    if not spec.continuous:
        kind = (f"{spec.num_actions} discrete actions" if spec.discrete
                else f"multi-discrete actions {list(spec.action_nvec)}")
        raise ConfigError(f"{name} needs a continuous action space, but {spec.env_id} has {kind}; "
                          "use dqn, ppo or a2c")


def check_positive(config, *fields: str) -> None:
    for f in fields:
        v = getattr(config, f)
        if v is not None and v <= 0:
            raise ConfigError(f"--{f.replace('_', '-')} must be positive, got {v}")


def config_dict(config) -> dict:
    return dataclasses.asdict(config)


class Agent(NamedTuple):
    """An algorithm bound to an env spec and config: three pure functions.

    init(seed) -> state                                  TensorDict
    act(state, obs, carry, explore) -> (action, extras, carry)
    update(state, batch) -> (state, metrics)             compiled by the training loop
    """

    init: Callable
    act: Callable
    update: Callable


def actor_critic_policy(spec: EnvSpec, hidden=(64, 64), activation: str = "tanh", conv="nature",
                        init_log_std: float = 0.0):
    """The actor-critic network of A2C / PPO and its pure forward.

    Returns `(build, policy)`: `build()` makes a freshly initialized `ActorCritic`, and
    `policy(params, obs) -> (dist, value)` evaluates it functionally, with `dist` the
    tuple that `action_dist(spec)`'s functions take. `policy(params, obs, value=False)`
    returns `(dist, None)`, leaving out the critic where it has an MLP of its own (vector
    observations): eager acting skips its cost, and a compiled graph drops it either way.
    """
    from fnrl.nets import ActorCritic, call
    from fnrl.nets.core import Flatten

    def build():
        return ActorCritic(spec.obs_shape, spec.action_dim, spec.continuous, hidden, activation, conv,
                           init_log_std)

    net = build()
    separate = isinstance(net.torso, Flatten)   # the actor's and critic's own MLPs on the flat observation

    def policy(params, obs, value: bool = True):
        if separate:   # each MLP called alone: `fnrl.nets.call` runs a plain MLP as its ops in eager mode
            flat = net.torso(obs)
            out = call(net.actor, params["actor"], flat)
            v = call(net.critic, params["critic"], flat).squeeze(-1) if value else None
        else:
            out, v = call(net, params, obs)
        return ((out, params["log_std"].expand_as(out)) if spec.continuous else (out,)), (v if value else None)

    return build, policy


def shares_torso(obs_shape) -> bool:
    """Whether `actor_critic_policy`'s actor and critic share one torso (a conv torso for image
    observations; vector observations get separate MLPs): then the value costs one linear head
    beside the policy, else a whole second MLP."""
    return not isinstance(obs_shape, dict) and len(obs_shape) == 3


@contextlib.contextmanager
def initializing(seed: int, *key: int):
    """A block whose torch draws come from the network-initialization stream of the run seeded
    `seed` (`fnrl.rng.INIT`, with `key` a child stream of it); the global RNG is as it was afterwards."""
    with torch.random.fork_rng():
        torch.manual_seed(rng.derive(seed, rng.INIT, *key))
        yield


def init_params(build: Callable, seed: int) -> TensorDict:
    """Parameters of `build()` initialized from the run seed `seed` (`initializing`), leaving the
    global RNG untouched."""
    from fnrl.nets import parameters

    with initializing(seed):
        return parameters(build())


class RecurrentActorCriticPolicy(NamedTuple):
    """The recurrent actor-critic of A2C / PPO (`core="lstm"|"gru"`) as pure functions.

    build() -> a freshly initialized `RecurrentActorCritic`.
    unroll(params, obs [T, B, ...], reset [T, B], carry [B]) -> (dist, value [T, B], carry).
    step(params, obs [B, ...], carry) -> (dist, value [B], carry_out, carry_in): one acting
        step under the sampler's protocol (fnrl.nets.recurrent): `carry` is None (start
        from zeros) or a TensorDict [B] with the core's keys and an optional "reset" [B];
        `carry_in` is the state the step started from (after the reset), which the
        agent returns as `extras["carry"]`.
    rollout_unroll(params, obs_all [T + 1, B, ...], rollout) -> (dist, value [T + 1, B]):
        the re-unroll of a [T, B] segment from `rollout["carry"][0]` with
        `rollout["reset"]`, one step further onto the final next observation (whose reset
        is `not valid[T - 1]`), so the last value is the bootstrap value.
    """

    build: Callable
    unroll: Callable
    step: Callable
    rollout_unroll: Callable


def recurrent_actor_critic_policy(spec: EnvSpec, core: str = "lstm", core_size: int = 128, hidden=(64,),
                                  activation: str = "tanh", conv="nature",
                                  init_log_std: float = 0.0) -> RecurrentActorCriticPolicy:
    from fnrl.nets import RecurrentActorCritic, call
    from fnrl.nets.recurrent import reset_carry

    def build():
        return RecurrentActorCritic(spec.obs_shape, spec.action_dim, spec.continuous, core, core_size, hidden,
                                    activation, conv, init_log_std)

    net = build()
    keys = net.carry_keys

    def unroll(params, obs, reset, carry):
        out, value, carry = call(net, params, obs, reset, carry)
        return ((out, params["log_std"].expand_as(out)) if spec.continuous else (out,)), value, carry

    def step(params, obs, carry):
        B = obs.shape[0]
        if carry is None:
            carry_in = net.initial_carry([B], device=obs.device)
        elif "reset" in carry.keys():
            carry_in = reset_carry(carry.select(*keys), carry["reset"])
        else:
            carry_in = carry.select(*keys)
        no_reset = torch.zeros(1, B, dtype=torch.bool, device=obs.device)
        d, value, carry_out = unroll(params, obs.unsqueeze(0), no_reset, carry_in)
        return tuple(x.squeeze(0) for x in d), value.squeeze(0), carry_out, carry_in

    def rollout_unroll(params, obs_all, rollout):
        reset = torch.cat([rollout["reset"], ~rollout["valid"][-1:]])
        d, value, _ = unroll(params, obs_all, reset, rollout["carry"][0])
        return d, value

    return RecurrentActorCriticPolicy(build, unroll, step, rollout_unroll)


def config_policy(config, spec: EnvSpec, network=None):
    """The actor-critic of an A2C / PPO / IMPALA `config` (fields core, core_size, hidden,
    activation, conv, init_log_std), with the torso `network` in place of `config.conv`'s when
    given (`fnrl.nets.core.user_torso`): `(build, rnn, policy)` with `rnn` a
    `RecurrentActorCriticPolicy` when `config.core` is "lstm" or "gru" (then `policy` is None),
    else `rnn` None and `policy(params, obs) -> (dist, value)` the feed-forward forward."""
    torso = config.conv if network is None else network
    if config.core != "none":
        rnn = recurrent_actor_critic_policy(spec, config.core, config.core_size, config.hidden, config.activation,
                                            torso, config.init_log_std)
        return rnn.build, rnn, None
    build, policy = actor_critic_policy(spec, config.hidden, config.activation, torso, config.init_log_std)
    return build, None, policy
