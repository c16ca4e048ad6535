"""Functional, optax-shaped optimizers over parameter TensorDicts.

A `GradientTransformation` is a pair of pure functions

    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    params = apply_updates(params, updates)          # params + updates

`updates` is the step to ADD to the parameters (already negated and scaled by the
learning rate), as in optax. `state` is a TensorDict (nested for `chain`) whose
shapes and dtypes never change, with an int64 0-d `step` counter in every stateful
transform, so a compiled update is traced once and never recompiles.

Every update is a handful of TensorDict arithmetic calls, each one `torch._foreach_*`
kernel over all the leaves, with no per-tensor Python loop. Compile habits: use
`td.mul(t)`, `td.div(t)`, `td.add(...)` (never `td * t` in operator form) and keep
`params.to_module(...)` out of compiled code.

Each transformation of this module also has `update_leaves`, the same arithmetic on flat lists
of the leaves (`Layout`), which `fnrl.algos.common.gradient_step` runs wherever the parameters
have a `Layout`: in plain eager mode one `torch._foreach_*` call per operation without rebuilding
nested TensorDicts after each (`benchmarks/probes/eager_step.md`); traced (torch.compile, export)
or under a torch.func transform the same op leaf by leaf, which TorchDynamo traces faster than
the TensorDict calls and torch.func.vmap batches. A chain of
[clip_by_global_norm], scale_by_adam and a learning rate also has `apply_leaves`, which plain
eager steps run instead: the whole step as torch's fused Adam kernel, the same numbers up to
float rounding. A transformation without `update_leaves` (one of yours) is run through `update`.

The optimizers are built like optax's, by chaining small transformations, and follow
torch.optim's arithmetic step for step (tests compare them on an MLP in float64):

    sgd     = chain(trace(momentum, nesterov), scale_by_learning_rate(lr))
    adam    = chain(add_decayed_weights(wd), scale_by_adam(...), scale_by_learning_rate(lr))
    adamw   = chain(scale_by_adam(...), add_decayed_weights(wd), scale_by_learning_rate(lr))
    rmsprop = chain(scale_by_rms(...), trace(momentum), scale_by_learning_rate(lr))

A learning rate is a float, a 0-d tensor, or a schedule `step -> tensor` that is
evaluated at the number of updates already done (0 on the first update), like
`torch.optim.lr_scheduler.LambdaLR` stepped after every `optimizer.step()`.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Union

import torch
from tensordict import TensorDict, TensorDictBase

from fnrl.tensordicts import entries, leaf_reader, unchecked_tensordict

__all__ = [
    "GradientTransformation",
    "Stage",
    "Layout",
    "Schedule",
    "init_step",
    "constant_schedule",
    "linear_schedule",
    "cosine_schedule",
    "global_norm",
    "clip_by_global_norm",
    "add_decayed_weights",
    "trace",
    "scale_by_adam",
    "scale_by_rms",
    "scale_by_learning_rate",
    "scale_by_stored_learning_rate",
    "chain",
    "sgd",
    "adam",
    "adamw",
    "rmsprop",
    "apply_updates",
    "apply_leaf_updates",
    "plain_eager",
    "polyak",
    "hard_update",
]

Schedule = Callable[[torch.Tensor], torch.Tensor]
ScalarOrSchedule = Union[float, torch.Tensor, Schedule]


class Stage(NamedTuple):
    """What `chain`'s fused eager step needs to know of one elementary transformation.

    kind: "identity" (passes gradients through), "clip" (args: max_norm), "adam" (args: b1, b2,
    eps) or "rate" (args: one function, state -> (learning rate, new state))."""

    kind: str
    args: tuple = ()


class GradientTransformation(NamedTuple):
    """init(params) -> state;  update(grads, state, params=None) -> (updates, new_state).

    update_leaves (optional): `update` on leaves, update_leaves(grads, state, params, layout) ->
    (updates, new_state), with grads, params and updates lists in `layout`'s order (params may
    be None for a transformation that does not read them) and the state as in `update`.
    stages (optional): ((path of its state, `Stage`), ...) of each elementary transformation in
    order, where every one is known (`chain` joins them).
    apply_leaves (optional): the whole step on leaves, apply_leaves(grads, state, params, layout)
    -> (new params, new_state), params + updates up to float rounding (`chain`'s fused Adam).
    """

    init: Callable[[TensorDictBase], TensorDictBase]
    update: Callable[..., tuple[TensorDictBase, TensorDictBase]]
    update_leaves: Callable | None = None
    stages: tuple | None = None
    apply_leaves: Callable | None = None


class Layout:
    """The leaves of a parameter TensorDict as a flat list and back: `leaves(td)` lists the
    leaves of a TensorDict of the same structure (parameters, gradients, an optimizer's moments)
    in one order, and `tree(leaves)` builds such a TensorDict from a list, its nested TensorDicts
    with their batch sizes (stacked critics [K]).

    `Layout.of(params)` is None where the list form does not apply: parameters with a batch size,
    a leaf that is not floating point, or a nested TensorDict with no leaves."""

    def __init__(self, keys: list, sizes: dict | None = None):
        self.keys = keys
        self.sizes = sizes or {}
        self._readers = [leaf_reader(key) for key in keys]
        self._plan = _plan(keys, self.sizes)

    @classmethod
    def of(cls, params: TensorDictBase) -> "Layout | None":
        if params.batch_size != ():
            return None
        keys, sizes = [], {}
        if not _walk(params, (), keys, sizes):
            return None
        return _layout(cls, tuple(keys), tuple(sizes.items()))

    def leaves(self, td: TensorDictBase) -> list[torch.Tensor]:
        return [read(td) for read in self._readers]

    def tree(self, leaves: list[torch.Tensor]) -> TensorDict:
        return _tree(self._plan, leaves)


@functools.lru_cache(maxsize=64)
def _layout(cls, keys: tuple, sizes: tuple) -> Layout:
    """One `Layout` per structure: its leaf readers are made once."""
    return cls(list(keys), dict(sizes))


def _walk(td: TensorDictBase, prefix: tuple, keys: list, sizes: dict) -> bool:
    """Append the key tuples of `td`'s leaves to `keys` in `td.keys(include_nested=True,
    leaves_only=True)`'s order and note the batch size of each nested TensorDict that has one in
    `sizes`; False where a leaf is not floating point or a nested TensorDict has no leaves."""
    for name, value in entries(td):
        key = (*prefix, name)
        if isinstance(value, TensorDictBase):
            count = len(keys)
            if not _walk(value, key, keys, sizes) or len(keys) == count:   # tree() would drop an empty node
                return False
            if value.batch_dims:
                sizes[key] = value.batch_size
        elif not value.is_floating_point():
            return False
        else:
            keys.append(key)
    return True


_SCALAR = torch.Size([])


def _plan(keys: list, sizes: dict) -> tuple:
    """How `tree` nests a list of leaves in `keys`' order: (batch size, [(name, leaf index or the
    nested node's plan), ...]) of the root, the nested TensorDicts with their `sizes` (else [])."""
    root: dict = {}
    for index, key in enumerate(keys):
        node = root
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = index

    def plan(node: dict, path: tuple) -> tuple:
        return sizes.get(path, _SCALAR), [(name, plan(value, (*path, name)) if type(value) is dict else value)
                                          for name, value in node.items()]
    return plan(root, ())


def _tree(plan: tuple, leaves: list[torch.Tensor]) -> TensorDict:
    """The TensorDict (no device) of `leaves` nested as `plan` says (`unchecked_tensordict`: the
    layouts' keys and leaves are known good)."""
    size, nested = plan
    return unchecked_tensordict({name: leaves[at] if type(at) is int else _tree(at, leaves) for name, at in nested},
                                size)


# ---------------------------------------------------------------------------
# state and schedules
# ---------------------------------------------------------------------------


def plain_eager() -> bool:
    """True outside torch.compile and outside any torch.func transform (vmap, grad)."""
    return not torch.compiler.is_compiling() and torch._C._functorch.peek_interpreter_stack() is None


def _each(op: str, *args, **kwargs) -> list[torch.Tensor]:
    """`torch._foreach_<op>(*args, **kwargs)` over lists of leaves in plain eager mode: one call for
    all the leaves. Else (traced, or under a torch.func transform) `torch.<op>` leaf by leaf: no
    `_foreach_*` op has a torch.func.vmap batching rule, and Inductor fuses each leaf's chain of
    ops into one kernel. Out of place only: Inductor cannot lower an in-place `_foreach_*` op
    inside a `torch._higher_order_ops.scan` body."""
    if plain_eager():
        return getattr(torch, "_foreach_" + op)(*args, **kwargs)
    fn = getattr(torch, op)
    count = len(next(a for a in args if isinstance(a, (list, tuple))))
    return [fn(*(a[i] if isinstance(a, (list, tuple)) else a for a in args), **kwargs) for i in range(count)]


def _leaves(params: TensorDictBase | torch.Tensor) -> list[torch.Tensor]:
    return [params] if torch.is_tensor(params) else list(params.values(include_nested=True, leaves_only=True))


def _device(params: TensorDictBase | torch.Tensor) -> torch.device:
    """The device of the first leaf of `params` (the TensorDict's own device when it has none)."""
    leaves = _leaves(params)
    return leaves[0].device if leaves else params.device


def init_step(params: TensorDictBase) -> torch.Tensor:
    """A 0-d int64 update counter, on the device of the first leaf of `params`, set to 0."""
    return torch.zeros((), dtype=torch.int64, device=_device(params))


def hyperparameter(value: float, params: TensorDictBase | torch.Tensor) -> torch.Tensor:
    """`value` as a 0-d tensor in the floating dtype of `params` (float32 unless the parameters
    are float64), on their device: a hyperparameter held in an optimizer state.

    Not float64 for float32 parameters: TorchDynamo (torch 2.13) gives every 0-d float64 CPU
    input a Python-float symbol, and a compiled function that takes one traces twice (its
    first trace ends in a restart, `_tensorify_python_scalars`): PPO's cold compile went from
    about 21 to 12 s of tracing."""
    floating = [t for t in _leaves(params) if t.is_floating_point()]
    dtype = floating[0].dtype if floating else torch.get_default_dtype()
    return torch.tensor(float(value), dtype=dtype, device=_device(params))


def _step_as_float(step: torch.Tensor) -> torch.Tensor:
    # float64 so schedules and bias corrections stay exact for float64 params; a
    # 0-d tensor does not promote the dtype of the parameter leaves it multiplies
    return step.to(torch.float64)


def constant_schedule(value: float) -> Schedule:
    """lr(step) = value, as a float64 tensor shaped like `step`."""

    def schedule(step: torch.Tensor) -> torch.Tensor:
        return torch.full_like(step, value, dtype=torch.float64)

    return schedule


def linear_schedule(init_value: float, end_value: float, steps: int) -> Schedule:
    """lr(step) = init + (end - init) * clamp(step / steps, 0, 1)  (constant `end` after `steps`)."""
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")

    def schedule(step: torch.Tensor) -> torch.Tensor:
        fraction = (_step_as_float(step) / steps).clamp(0.0, 1.0)
        return init_value + (end_value - init_value) * fraction

    return schedule


def cosine_schedule(init_value: float, steps: int, alpha: float = 0.0) -> Schedule:
    """Cosine decay (Loshchilov & Hutter 2017, SGDR, arXiv:1608.03983), as optax's.

    lr(step) = init * ((1 - alpha) * (1 + cos(pi * min(step, steps) / steps)) / 2 + alpha),
    so it falls from `init` to `alpha * init` at `steps` and stays there.
    """
    if steps <= 0:
        raise ValueError(f"steps must be positive, got {steps}")

    def schedule(step: torch.Tensor) -> torch.Tensor:
        fraction = (_step_as_float(step) / steps).clamp(0.0, 1.0)
        cosine = 0.5 * (1.0 + torch.cos(math.pi * fraction))
        return init_value * ((1.0 - alpha) * cosine + alpha)

    return schedule


def _value_at(value: ScalarOrSchedule, step: torch.Tensor):
    """A hyperparameter at `step`: schedules are called, floats and tensors pass through."""
    return value(step) if callable(value) else value


# ---------------------------------------------------------------------------
# elementary transformations
# ---------------------------------------------------------------------------


def _empty_state(params: TensorDictBase) -> TensorDictBase:
    return TensorDict({}, batch_size=[])


def _zeros_like(params: TensorDictBase) -> TensorDictBase:
    """Zeros with the structure, shapes and dtypes of `params`, detached from any graph."""
    return params.detach().apply(torch.zeros_like)


def global_norm(tree: TensorDictBase) -> torch.Tensor:
    """||g|| = sqrt(sum over all leaves of sum g^2), a 0-d tensor."""
    if torch.compiler.is_compiling():
        return _norm_of_leaves(list(tree.values(include_nested=True, leaves_only=True)))
    # TensorDict.norm is one _foreach_norm, or one norm per leaf under torch.func.vmap
    leaf_norms = tree.norm().values(include_nested=True, leaves_only=True)
    return torch.linalg.vector_norm(torch.stack(list(leaf_norms)))


def _norm_of_leaves(leaves: list[torch.Tensor]) -> torch.Tensor:
    """The global norm of a list of tensors: one `_foreach_norm` in plain eager mode; else per-leaf
    sums of squares, which Inductor fuses (it has no lowering for `_foreach_norm`, and AOTInductor
    calls it through its slow proxy fallback) and torch.func.vmap batches."""
    if not plain_eager():
        return torch.stack([leaf.square().sum() for leaf in leaves]).sum().sqrt()
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(leaves)))


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Rescale all gradients together so that their global norm is at most `max_norm`.

    g <- g * min(1, max_norm / (||g|| + 1e-6)),   ||g|| = sqrt(sum_i ||g_i||^2)
    (Pascanu et al. 2013, arXiv:1211.5063), the arithmetic of
    `torch.nn.utils.clip_grad_norm_`. Stateless.
    """

    def update(grads, state, params=None):
        scale = (max_norm / (global_norm(grads) + 1e-6)).clamp(max=1.0)
        return grads.mul(scale), state

    def update_leaves(grads, state, params, layout):
        return _clip_leaves(grads, max_norm), state

    return GradientTransformation(_empty_state, update, update_leaves, (((), Stage("clip", (max_norm,))),))


def _clip_leaves(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    return _each("mul", grads, (max_norm / (_norm_of_leaves(grads) + 1e-6)).clamp(max=1.0))


def add_decayed_weights(weight_decay: float | torch.Tensor) -> GradientTransformation:
    """g <- g + weight_decay * params (an L2 term before Adam; decoupled decay after it).

    Needs `params` in `update`. Stateless; weight_decay == 0 passes gradients through.
    """

    off = isinstance(weight_decay, (int, float)) and weight_decay == 0

    def needs(params):
        if params is None:
            raise ValueError("weight decay needs the parameters: call update(grads, state, params)")
        return params

    def update(grads, state, params=None):
        return (grads, state) if off else (grads.add(needs(params).mul(weight_decay)), state)

    def update_leaves(grads, state, params, layout):
        return (grads, state) if off else (_each("add", grads, _each("mul", needs(params), weight_decay)), state)

    return GradientTransformation(_empty_state, update, update_leaves, (((), Stage("identity")),) if off else None)


def trace(momentum: float = 0.9, nesterov: bool = False) -> GradientTransformation:
    """Heavy-ball momentum (Polyak 1964; Sutskever et al. 2013 for Nesterov).

    b <- momentum * b + g;  out = b,  or  out = g + momentum * b  with nesterov.
    The buffer starts at 0, so the first output is g, as in torch.optim.SGD.
    momentum == 0 passes gradients through with an empty state.
    """
    if momentum == 0:
        if nesterov:
            raise ValueError("nesterov momentum needs momentum > 0")
        return GradientTransformation(_empty_state, lambda grads, state, params=None: (grads, state),
                                      lambda grads, state, params, layout: (grads, state), (((), Stage("identity")),))

    def init(params):
        return TensorDict({"momentum_buffer": _zeros_like(params)}, batch_size=[])

    def update(grads, state, params=None):
        buffer = state["momentum_buffer"].mul(momentum).add(grads)
        out = grads.add(buffer, alpha=momentum) if nesterov else buffer
        return out, TensorDict({"momentum_buffer": buffer}, batch_size=[])

    def update_leaves(grads, state, params, layout):
        buffer = _each("add", _each("mul", layout.leaves(state["momentum_buffer"]), momentum), grads)
        out = _each("add", grads, buffer, alpha=momentum) if nesterov else buffer
        return out, TensorDict({"momentum_buffer": layout.tree(buffer)}, batch_size=[])

    return GradientTransformation(init, update, update_leaves)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Adam's direction (Kingma & Ba 2015, arXiv:1412.6980), with torch.optim's arithmetic.

    m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2,   t <- t + 1,
    out = (m / (1 - b1^t)) / (sqrt(v) / sqrt(1 - b2^t) + eps).
    """

    def init(params):
        zeros = _zeros_like(params)
        return TensorDict(
            {"step": init_step(params), "exp_avg": zeros, "exp_avg_sq": zeros.clone()}, batch_size=[]
        )

    def corrections(state):
        """(t + 1, 1 - b1^(t+1), sqrt(1 - b2^(t+1)))."""
        step = state["step"] + 1
        t = _step_as_float(step)
        return step, 1.0 - torch.pow(b1, t), torch.sqrt(1.0 - torch.pow(b2, t))

    def update(grads, state, params=None):
        step, bias_correction1, bias_correction2_sqrt = corrections(state)
        exp_avg = state["exp_avg"].lerp(grads, 1.0 - b1)
        exp_avg_sq = state["exp_avg_sq"].mul(b2).addcmul(grads, grads, value=1.0 - b2)
        denom = exp_avg_sq.sqrt().div(bias_correction2_sqrt).add(eps)
        out = exp_avg.div(denom).div(bias_correction1)
        return out, TensorDict({"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, batch_size=[])

    def update_leaves(grads, state, params, layout):
        step, bias_correction1, bias_correction2_sqrt = corrections(state)
        exp_avg = _each("lerp", layout.leaves(state["exp_avg"]), grads, 1.0 - b1)
        exp_avg_sq = _each("mul", layout.leaves(state["exp_avg_sq"]), b2)
        exp_avg_sq = _each("addcmul", exp_avg_sq, grads, grads, value=1.0 - b2)
        denom = _each("add", _each("div", _each("sqrt", exp_avg_sq), bias_correction2_sqrt), eps)
        out = _each("div", _each("div", exp_avg, denom), bias_correction1)
        return out, TensorDict({"step": step, "exp_avg": layout.tree(exp_avg), "exp_avg_sq": layout.tree(exp_avg_sq)},
                               batch_size=[])

    return GradientTransformation(init, update, update_leaves, (((), Stage("adam", (b1, b2, eps))),))


def scale_by_rms(alpha: float = 0.99, eps: float = 1e-8, centered: bool = False) -> GradientTransformation:
    """RMSprop's direction (Tieleman & Hinton 2012), with torch.optim.RMSprop's arithmetic.

    s <- alpha s + (1 - alpha) g^2;  centered: a <- alpha a + (1 - alpha) g, s' = s - a^2;
    out = g / (sqrt(s') + eps)      (eps outside the square root, as torch does;
    Graves 2013, arXiv:1308.0850, for the centered variant).
    """

    def init(params):
        zeros = _zeros_like(params)
        state = {"square_avg": zeros}
        if centered:
            state["grad_avg"] = zeros.clone()
        return TensorDict(state, batch_size=[])

    def update(grads, state, params=None):
        square_avg = state["square_avg"].mul(alpha).addcmul(grads, grads, value=1.0 - alpha)
        new_state = {"square_avg": square_avg}
        if centered:
            grad_avg = state["grad_avg"].lerp(grads, 1.0 - alpha)
            variance = square_avg.addcmul(grad_avg, grad_avg, value=-1.0)
            new_state["grad_avg"] = grad_avg
        else:
            variance = square_avg
        return grads.div(variance.sqrt().add(eps)), TensorDict(new_state, batch_size=[])

    def update_leaves(grads, state, params, layout):
        square_avg = _each("addcmul", _each("mul", layout.leaves(state["square_avg"]), alpha), grads, grads,
                           value=1.0 - alpha)
        new_state = {"square_avg": layout.tree(square_avg)}
        variance = square_avg
        if centered:
            grad_avg = _each("lerp", layout.leaves(state["grad_avg"]), grads, 1.0 - alpha)
            variance = _each("addcmul", square_avg, grad_avg, grad_avg, value=-1.0)
            new_state["grad_avg"] = layout.tree(grad_avg)
        denom = _each("add", _each("sqrt", variance), eps)
        return _each("div", grads, denom), TensorDict(new_state, batch_size=[])

    return GradientTransformation(init, update, update_leaves)


def scale_by_learning_rate(lr: ScalarOrSchedule) -> GradientTransformation:
    """out = -lr(step) * g: the descent step, evaluated at the number of updates done so far."""

    def init(params):
        return TensorDict({"step": init_step(params)}, batch_size=[])

    def rate_and_state(state):
        step = state["step"]
        return _value_at(lr, step), TensorDict({"step": step + 1}, batch_size=[])

    def update(grads, state, params=None):
        rate, new_state = rate_and_state(state)
        return grads.mul(-rate), new_state

    def update_leaves(grads, state, params, layout):
        rate, new_state = rate_and_state(state)
        return _each("mul", grads, -rate), new_state

    return GradientTransformation(init, update, update_leaves, (((), Stage("rate", (rate_and_state,))),))


def scale_by_stored_learning_rate(lr: float, schedule: Schedule | None = None) -> GradientTransformation:
    """out = -lr * schedule(step) * g, with `lr` a tensor held in the state (optax's inject_hyperparams).

    The state is {"lr": 0-d in the parameters' dtype (`hyperparameter`), "step": int64 0-d}.
    Because the rate lives in the state rather than in the closure, states stacked along a
    leading axis and vmapped over may each hold their own rate (fnrl.seeds: hyperparameter
    sweeps in one process).
    `schedule` (optional) multiplies the stored rate, e.g. `linear_schedule(1.0, 0.0, N)`.
    """

    def init(params):
        return TensorDict({"lr": hyperparameter(lr, params), "step": init_step(params)}, batch_size=[])

    def rate_and_state(state):
        step, rate = state["step"], state["lr"]
        if schedule is not None:
            rate = rate * schedule(step)
        return rate, TensorDict({"lr": state["lr"], "step": step + 1}, batch_size=[])

    def update(grads, state, params=None):
        rate, new_state = rate_and_state(state)
        return grads.mul(-rate), new_state

    def update_leaves(grads, state, params, layout):
        rate, new_state = rate_and_state(state)
        return _each("mul", grads, -rate), new_state

    return GradientTransformation(init, update, update_leaves, (((), Stage("rate", (rate_and_state,))),))


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply transformations in order; the state is a TensorDict {"0": state_0, "1": state_1, ...}."""

    def init(params):
        return TensorDict({str(i): tx.init(params) for i, tx in enumerate(transforms)}, batch_size=[])

    def update(grads, state, params=None):
        new_state = {}
        for i, tx in enumerate(transforms):
            grads, new_state[str(i)] = tx.update(grads, state[str(i)], params)
        return grads, TensorDict(new_state, batch_size=[])

    def update_leaves(grads, state, params, layout):
        new_state = {}
        for i, tx in enumerate(transforms):
            grads, new_state[str(i)] = tx.update_leaves(grads, state[str(i)], params, layout)
        return grads, TensorDict(new_state, batch_size=[])

    leaves = all(tx.update_leaves is not None for tx in transforms)
    stages = None
    if all(tx.stages is not None for tx in transforms):
        stages = tuple(((str(i), *path), stage) for i, tx in enumerate(transforms) for path, stage in tx.stages)
    return GradientTransformation(init, update, update_leaves if leaves else None, stages,
                                  _fused_adam(stages, update_leaves) if leaves and stages else None)


_FUSED_ADAM_DEVICES = ("cpu", "cuda")


def _fused_adam(stages: tuple, update_leaves: Callable) -> Callable | None:
    """`apply_leaves` of a chain of [clip_by_global_norm], scale_by_adam and a learning rate (any
    pass-through stages between them), else None: Adam as torch's fused kernel (`torch.optim.Adam`'s
    `fused=True`), one kernel per parameter for the moments, the bias corrections and the step, where
    the unfused leaves take about ten `torch._foreach_*` calls (`benchmarks/probes/eager_step.md`).

    The same arithmetic as `update_leaves` then `params + updates` up to float rounding (the kernel
    folds the rate and the first bias correction into one step size). On other devices than the CPU
    and CUDA, and for parameters that are not all float32 or all float64 on one device, it runs
    `update_leaves`."""
    known = [(path, stage) for path, stage in stages if stage.kind != "identity"]
    kinds = [stage.kind for _, stage in known]
    if kinds not in (["adam", "rate"], ["clip", "adam", "rate"]):
        return None
    clip = known[0][1].args[0] if kinds[0] == "clip" else None
    (adam_path, adam_stage), (rate_path, rate_stage) = known[-2:]
    b1, b2, eps = adam_stage.args
    (rate_and_state,) = rate_stage.args

    def apply_leaves(grads, state, params, layout):
        placements = {(p.device, p.dtype) for p in params}
        if len(placements) != 1 or params[0].device.type not in _FUSED_ADAM_DEVICES \
                or params[0].dtype not in (torch.float32, torch.float64):
            updates, new_state = update_leaves(grads, state, params, layout)
            return apply_leaf_updates(params, updates), new_state
        if clip is not None:
            grads = _clip_leaves(grads, clip)
        moments = _sub_state(state, adam_path)
        step = moments["step"] + 1
        rate, rate_state = rate_and_state(_sub_state(state, rate_path))
        new_params = torch._foreach_clone(params)
        exp_avg = torch._foreach_clone(layout.leaves(moments["exp_avg"]))
        exp_avg_sq = torch._foreach_clone(layout.leaves(moments["exp_avg_sq"]))
        rate = torch.as_tensor(rate, dtype=params[0].dtype, device=params[0].device)
        torch._fused_adam_(new_params, list(grads), exp_avg, exp_avg_sq, [], [step.to(torch.float32)] * len(params),
                           lr=rate, beta1=b1, beta2=b2, weight_decay=0.0, eps=eps, amsgrad=False, maximize=False)
        moments = unchecked_tensordict({"step": step, "exp_avg": layout.tree(exp_avg),
                                        "exp_avg_sq": layout.tree(exp_avg_sq)}, [])
        return new_params, _replaced(state, {adam_path: moments, rate_path: rate_state})

    return apply_leaves


def _sub_state(state: TensorDictBase, path: tuple) -> TensorDictBase:
    for key in path:
        state = state[key]
    return state


def _replaced(state: TensorDictBase, replacements: dict) -> TensorDictBase:
    """A new nested state with the sub-states at the given paths (tuples of keys) replaced; the
    others are the same TensorDicts."""
    if () in replacements:
        return replacements[()]
    items = {}
    for key, value in entries(state):
        inner = {path[1:]: new for path, new in replacements.items() if path[0] == key}
        items[key] = _replaced(value, inner) if inner else value
    return unchecked_tensordict(items, [])


# ---------------------------------------------------------------------------
# optimizers
# ---------------------------------------------------------------------------


def sgd(lr: ScalarOrSchedule, momentum: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """Stochastic gradient descent with optional (Nesterov) momentum, as torch.optim.SGD.

    b <- momentum b + g;  p <- p - lr * (b, or g + momentum b with nesterov).
    """
    return chain(trace(momentum, nesterov), scale_by_learning_rate(lr))


def adam(
    lr: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0
) -> GradientTransformation:
    """Adam as torch.optim.Adam: weight_decay is an L2 term added to the gradient first."""
    return chain(add_decayed_weights(weight_decay), scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr))


def adamw(
    lr: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2
) -> GradientTransformation:
    """AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101) as torch.optim.AdamW.

    p <- p - lr * (adam_direction + weight_decay * p)   (decay decoupled from Adam's moments).
    """
    return chain(scale_by_adam(b1, b2, eps), add_decayed_weights(weight_decay), scale_by_learning_rate(lr))


def rmsprop(
    lr: ScalarOrSchedule, alpha: float = 0.99, eps: float = 1e-8, centered: bool = False, momentum: float = 0.0
) -> GradientTransformation:
    """RMSprop as torch.optim.RMSprop: eps outside the square root, momentum on g / (sqrt(s) + eps).

    b <- momentum b + g / (sqrt(s') + eps);  p <- p - lr * b.
    """
    return chain(scale_by_rms(alpha, eps, centered), trace(momentum), scale_by_learning_rate(lr))


# ---------------------------------------------------------------------------
# applying updates and target networks
# ---------------------------------------------------------------------------


def apply_updates(params: TensorDictBase, updates: TensorDictBase) -> TensorDictBase:
    """New parameters params + updates (updates already hold the negative step).

    Each parameter keeps its dtype: a 0-d float64 schedule value or bias correction must not
    promote a 0-d float32 parameter (such as SAC's log-temperature) to float64.
    """
    return params.apply(lambda p, u: p + u.to(p.dtype), updates)


def apply_leaf_updates(params: list[torch.Tensor], updates: list[torch.Tensor]) -> list[torch.Tensor]:
    """`apply_updates` on lists of leaves (`Layout`): each parameter plus its update, in the
    parameter's dtype."""
    if any(u.dtype != p.dtype for u, p in zip(updates, params)):
        updates = [u.to(p.dtype) for u, p in zip(updates, params)]
    return _each("add", params, updates)


def polyak(target: TensorDictBase, online: TensorDictBase, tau: float | torch.Tensor) -> TensorDictBase:
    """Soft target update target <- (1 - tau) * target + tau * online, one fused lerp.

    (Lillicrap et al. 2016, DDPG, arXiv:1509.02971.) Returns the new target. A tensor `tau`
    (a 0-d weight computed in the update, e.g. DQN's tau * [update due]) goes to the fused lerp
    as a number where `weight_as_number` says so (the CPU), else as a tensor expanded (a view)
    to each leaf's shape.
    """
    if torch.is_tensor(tau) and not weight_as_number(tau):
        return target.lerp(online, target.apply(lambda t: tau.to(t.dtype).expand_as(t)))
    return target.lerp(online, tau)


def weight_as_number(tau: torch.Tensor) -> bool:
    """Whether `polyak` reads a tensor weight as a number: on the CPU, where the read costs
    nothing and the number form is the fastest (DQN's learner step ~0.94x as fast with the
    tensor form, `benchmarks/probes/polyak_weight.md`); not on a GPU, where a compiled step would
    read it off the device: a sync per update, which also forbids CUDA graph capture (DQN's
    first GPU run, `benchmarks/gpu_graphs.md`)."""
    return tau.device.type == "cpu"


def hard_update(target: TensorDictBase, online: TensorDictBase) -> TensorDictBase:
    """Hard target update target <- online (DQN's periodic copy); returns a copy of `online`.

    `target` only fixes the keys: it must have the same ones as `online`.
    """
    return target.apply(lambda _, o: o.clone(), online)
