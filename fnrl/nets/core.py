"""Torsos (MLP, Nature CNN, A3C conv) and the actor-critic network."""
from __future__ import annotations

import contextlib
import math

import torch
from tensordict import TensorDict
from torch import nn

from fnrl.errors import ConfigError
from fnrl.tensordicts import leaf_reader


def tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh(x), computed as 2 sigmoid(2x) - 1 inside `torch.compile`.

    The two agree to ~2e-7. Inductor's CPU tanh (a precise vectorized kernel) costs about
    3x its fused sigmoid form on AVX2 machines, and tanh layers are the largest elementwise
    cost of the MLP policies' updates; eager mode keeps `torch.tanh` (one op instead of three).
    """
    if torch.compiler.is_compiling():
        return 2.0 * torch.sigmoid(2.0 * x) - 1.0
    return torch.tanh(x)


class Tanh(nn.Module):
    """`nn.Tanh` through `fnrl.nets.core.tanh` (the fast form under torch.compile)."""

    def forward(self, x):
        return tanh(x)


_ACTIVATIONS = {"tanh": Tanh, "relu": nn.ReLU}

FEW_ROWS = 8
"""Row count up to which `Linear` may compute its product elementwise under torch.compile."""

FEW_ROWS_MACS = 65_536
"""Multiply-adds (rows x in x out) up to which a `Linear` with at most FEW_ROWS rows does."""

_VMAPPED_ROWS = 1   # set by `vmapped_rows`: each row a Linear sees stands for this many
_PLAIN = False      # set by `plain_products`


@contextlib.contextmanager
def vmapped_rows(n: int):
    """While tracing a network vmapped over n rows (`torch.func.vmap` hides that axis), `Linear`
    counts each row it sees n times, so FEW_ROWS counts the rows actually multiplied."""
    global _VMAPPED_ROWS
    before, _VMAPPED_ROWS = _VMAPPED_ROWS, _VMAPPED_ROWS * n
    try:
        yield
    finally:
        _VMAPPED_ROWS = before


@contextlib.contextmanager
def plain_products():
    """While tracing for a program of any batch size (`fnrl.export`), every `Linear` traces as
    `F.linear`: the elementwise product's row test would pin the batch size to a range."""
    global _PLAIN
    before, _PLAIN = _PLAIN, True
    try:
        yield
    finally:
        _PLAIN = before


NARROW_OUT = 8
"""Output width up to which `NarrowLinear` computes its product elementwise under torch.compile."""


def _elementwise_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b as a broadcast product summed over the inputs: y[..., j] = sum_k x[..., k] W[j, k] + b[j]."""
    y = (x.unsqueeze(-2) * weight).sum(-1)
    return y if bias is None else y + bias


class Linear(nn.Linear):
    """`nn.Linear` (same parameters, same state dict) that under torch.compile computes a
    product of at most FEW_ROWS rows and FEW_ROWS_MACS multiply-adds elementwise:

        y[..., j] = sum_k x[..., k] W[j, k] + b[j]        x [..., K] (rows = x.numel() / K), W [J, K]

    That is the acting step of one to a few envs (the sampler's call of a compiled `act` on
    1-8 observations). Inductor fuses the sum with the activation around it into one loop,
    where a GEMM of a few rows is a library call whose dispatch costs more than its
    multiply-adds and whose code evicts the interpreter's from the caches between env steps.
    Acting ahead of time (`benchmarks/probes/few_rows.md`, 2-core CPU): DQN's 1-env 4-120-84-2
    Q-network 12.6 instead of 19.1 us a call, SAC's 1-env 17-256-256-12 actor 23.1 instead of
    40.5, PPO's 4-env 64-64 policy 20.9 instead of 32.9; the training loops of DQN (1 env) and
    PPO (4 envs) with CleanRL's CartPole settings 1.10x faster per env step. Updates (batches
    of 32 and more rows) and eager mode use `F.linear`.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and not _PLAIN and self._elementwise(x):
            return _elementwise_linear(x, self.weight, self.bias)
        return super().forward(x)

    def _elementwise(self, x: torch.Tensor) -> bool:
        rows = x.numel() // max(self.in_features, 1) * _VMAPPED_ROWS
        return rows <= FEW_ROWS and rows * self.in_features * self.out_features <= FEW_ROWS_MACS


class NarrowLinear(Linear):
    """`Linear` for a head with few outputs, which under torch.compile runs as a broadcast
    product summed over the inputs whenever it has at most NARROW_OUT outputs, at any row count:

        y[..., j] = sum_k x[..., k] W[j, k] + b[j]        x [..., K], W [J, K], J <= NARROW_OUT

    Inductor fuses that sum, and its backward (dx = g W, dW = sum over rows of g x), into the
    kernels around it, where a [N, K] x [K, J] GEMM with J of 1 or 2 is a library call that
    moves the whole [N, K] input for a few multiply-adds per row. The vector-observation
    actor-critic's policy and value heads use it: PPO CartPole's compiled update runs
    1.05-1.11x faster with 128- to 2048-row minibatches, vmapped seeds too, while the ReLU
    heads of DQN and TD3 (batch 128 / 256) ran 0.96x with it and keep `Linear`
    (`benchmarks/probes/narrow_heads.md`). Wider layers, and eager mode, use `F.linear`.
    """

    def _elementwise(self, x: torch.Tensor) -> bool:
        return self.out_features <= NARROW_OUT or super()._elementwise(x)


def parameters(module: nn.Module) -> TensorDict:
    """The module's parameters and buffers as a TensorDict of plain tensors (a copy)."""
    return TensorDict.from_module(module).detach().clone()


def call(module: nn.Module, params: TensorDict, *inputs):
    """`module(*inputs)` with `params` (a TensorDict shaped like `parameters(module)`) in
    place of its own parameters and buffers.

    Under torch.compile this is `torch.func.functional_call` (traced away). Outside it, an
    `nn.Sequential` of linear layers and tanh / ReLU activations (`_chain`) runs as its ops
    straight on `params`' tensors, without the modules' calls; any other module gets the
    tensors swapped straight into its submodules' parameter dicts and back, which costs about
    a tenth of functional_call's generic swapping on small networks. Every form computes the
    same ops, and all work under torch.func transforms (vmap, grad).
    """
    if torch.compiler.is_compiling():
        return torch.func.functional_call(module, params.flatten_keys(".").to_dict(), inputs)
    chain = _chain(module)
    if chain is not None and len(inputs) == 1 and not _hooked(module):
        x = inputs[0]
        for op, weight, bias in chain:
            x = op(x) if weight is None else nn.functional.linear(x, weight(params), bias(params))
        return x
    slots = _slots(module)
    values = [params.get(key) for _, _, key in slots]
    saved = [table[name] for table, name, _ in slots]
    try:
        for (table, name, _), value in zip(slots, values):
            table[name] = value
        return module(*inputs)
    finally:
        for (table, name, _), value in zip(slots, saved):
            table[name] = value


_CHAIN_OPS = {Tanh: torch.tanh, nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.Identity: None}


def _chain(module: nn.Module) -> list | None:
    """`module`'s ops in eager mode when it is an `nn.Sequential` of `nn.Linear` (fnrl's
    subclasses included: eager, they are `F.linear`) with its own weight and bias, and tanh /
    ReLU / identity layers, else None: a list of (op, None, None) or (None, weight reader, bias reader),
    the readers `fnrl.tensordicts.leaf_reader`s of the layer's keys. Computed once per module and
    again whenever its layers change (a layer used twice runs twice)."""
    layers = tuple(module._modules.items())
    cached = module.__dict__.get("_fnrl_chain")
    if cached is not None and len(cached[0]) == len(layers) and all(
            name == n and layer is m for (name, layer), (n, m) in zip(cached[0], layers)):
        return cached[1]
    chain = [] if type(module) is nn.Sequential else None
    for name, layer in layers if chain is not None else ():
        if isinstance(layer, nn.Linear) and type(layer).forward in (nn.Linear.forward, Linear.forward) \
                and layer._parameters.get("weight") is not None and layer._parameters.get("bias") is not None:
            chain.append((None, leaf_reader((name, "weight")), leaf_reader((name, "bias"))))
        elif type(layer) in _CHAIN_OPS and not (isinstance(layer, nn.ReLU) and layer.inplace):
            if _CHAIN_OPS[type(layer)] is not None:
                chain.append((_CHAIN_OPS[type(layer)], None, None))
        else:
            chain = None
            break
    module.__dict__["_fnrl_chain"] = (layers, chain)
    return chain


def _hooked(module: nn.Module) -> bool:
    """Whether a hook (global, or of `module` or a layer; forward or backward) would be skipped by
    `_chain`'s ops."""
    from torch.nn.modules import module as lib

    if lib._global_forward_hooks or lib._global_forward_pre_hooks or lib._global_backward_hooks \
            or lib._global_backward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
               for m in (module, *module._modules.values()))


def _slots(module: nn.Module) -> list[tuple[dict, str, tuple[str, ...]]]:
    """(the dict that holds it, its name there, its key in `parameters(module)`) for every
    parameter and buffer of `module`, computed once per module."""
    slots = module.__dict__.get("_fnrl_slots")
    if slots is None:
        slots = []
        for path, sub in module.named_modules():
            prefix = tuple(path.split(".")) if path else ()
            for table in (sub._parameters, sub._buffers):
                slots += [(table, name, prefix + (name,)) for name, v in table.items() if v is not None]
        module.__dict__["_fnrl_slots"] = slots
    return slots


def layer_init(layer: nn.Module, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with `gain`, constant bias (the PPO implementation details)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, out_dim: int | None, hidden=(64, 64), activation: str = "tanh",
        out_gain: float = 1.0, head: type[nn.Linear] = Linear) -> nn.Sequential:
    """`Linear`-activation stack with orthogonal init; `out_dim=None` ends on the last hidden layer.
    `head`: the output layer's class (`NarrowLinear` for the actor-critic's heads)."""
    act = _ACTIVATIONS[activation]
    layers, d = [], in_dim
    for h in hidden:
        layers += [layer_init(Linear(d, h)), act()]
        d = h
    if out_dim is not None:
        layers.append(layer_init(head(d, out_dim), out_gain))
    return nn.Sequential(*layers)


def conv_out(size: tuple[int, int], layers) -> int:
    """Cells of a valid (unpadded) conv stack's output per channel for frames of `size` (H, W);
    layers: (kernel, stride) of each conv. ConfigError for frames too small for the stack."""
    h, w = size
    for kernel, stride in layers:
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    if h < 1 or w < 1:
        raise ConfigError(f"{size[0]}x{size[1]} frames are too small for the conv torso (kernels and strides "
                          f"{list(layers)}); use larger frames or a vector observation")
    return h * w


class _ConvTorso(nn.Module):
    """A conv stack over uint8 frames [*, C, H, W] (scaled to [0, 1]) -> [*, out_dim]; the
    linear layer after the convs is sized for (H, W) (`size`, default Atari's 84 x 84)."""

    out_dim: int

    def forward(self, x):
        lead = x.shape[:-3]
        frames = x.reshape(-1, *x.shape[-3:]).float() / 255.0
        # channels-last strides (written with permutes, which vmap supports): oneDNN's convolutions
        # run faster on them on the CPU (Nature CNN forward + backward 1.53-1.66x, benchmarks/probes/threads.md)
        frames = frames.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        return self.net(frames).reshape(*lead, self.out_dim)


class NatureCNN(_ConvTorso):
    """Mnih et al. (2015): 32x8x8/4, 64x4x4/2, 64x3x3/1, fc 512."""

    out_dim = 512

    def __init__(self, in_channels: int = 4, size: tuple[int, int] = (84, 84)):
        super().__init__()
        cells = conv_out(size, [(8, 4), (4, 2), (3, 1)])
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(64 * cells, 512)), nn.ReLU(),
        )


class A3CConv(_ConvTorso):
    """The smaller conv of A3C / rlpyt: 16x8x8/4, 32x4x4/2, fc 256."""

    out_dim = 256

    def __init__(self, in_channels: int = 4, size: tuple[int, int] = (84, 84)):
        super().__init__()
        cells = conv_out(size, [(8, 4), (4, 2)])
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 16, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(16, 32, 4, stride=2)), nn.ReLU(),
            nn.Flatten(), layer_init(nn.Linear(32 * cells, 256)), nn.ReLU(),
        )


class Flatten(nn.Module):
    """Flattens a vector observation's trailing dims into [*, D]; a dict observation
    (a TensorDict) becomes the concatenation of its flattened entries in key order."""

    def __init__(self, obs_shape):
        super().__init__()
        self.shapes = dict(sorted(obs_shape.items())) if isinstance(obs_shape, dict) else {None: obs_shape}

    def forward(self, x):
        parts = [(x if k is None else x[k]) for k in self.shapes]
        flat = [p.flatten(-len(s)) if len(s) != 1 else p for p, s in zip(parts, self.shapes.values())]
        return torch.cat([f.float() for f in flat], -1) if len(flat) > 1 else flat[0].float()


CONVS = ("nature", "a3c")
"""The built-in conv torsos (`NatureCNN`, `A3CConv`)."""


def encoder(obs_shape, conv="nature") -> tuple[nn.Module, int] | None:
    """(torso, feature size): a conv torso for image observations ([C, H, W]), None for other
    ones (vector or Dict observations: the networks' own MLPs); for a user's torso (`conv`
    "module:name", a factory or an nn.Module), that torso for any observation (`user_torso`)."""
    if is_user_torso(conv):
        return user_torso(conv, obs_shape)
    if isinstance(obs_shape, dict) or len(obs_shape) != 3:
        return None
    torso = {"nature": NatureCNN, "a3c": A3CConv}[conv](obs_shape[0], tuple(obs_shape[1:]))
    return torso, torso.out_dim


def is_user_torso(conv) -> bool:
    """Whether `conv` names or is a torso of the user's rather than a built-in conv torso's name."""
    return not isinstance(conv, str) or ":" in conv


def user_torso(source, obs_shape) -> tuple[nn.Module, int]:
    """(module, feature size): the user's torso, from `source`, one of
      - "module:name": a factory imported by name (`--conv module:name`, `Config.conv`); it is
        imported in every process, so it must be importable there (installed or on PYTHONPATH);
      - a factory `factory(obs_shape) -> (module, out_dim)` or `-> module`, called each time a
        network is built, so each seed's `init` initializes it afresh (under the seed's generator);
      - an nn.Module: a copy of it, with its current weights as every `init`'s (a pretrained
        encoder, say).
    The module maps observations [..., *obs_shape] (in the env's dtype: float32 vectors, uint8
    frames; a dict of them for Dict observations) to features [..., out_dim]. out_dim is the
    factory's, else the module's `out_dim` attribute, else read from its output on a zero float
    observation (in eval mode, on the module's device, the random generators left as they were).
    Every parameter trains, `requires_grad=False` ones too (a pretrained torso is fine-tuned).
    It takes the built-in torso's place, the algorithm's heads on top (actor and
    critic heads, Q heads, a recurrent core), and is called functionally (`call`: its parameters
    and buffers live in the training state)."""
    import copy

    shape = obs_shape if isinstance(obs_shape, dict) else tuple(obs_shape)
    if isinstance(source, nn.Module):
        made = copy.deepcopy(source)
    else:
        made = (source if callable(source) else _torso_factory(source))(shape)
    if isinstance(made, nn.Module):
        return made, _feature_size(made, obs_shape, source)
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)
            and isinstance(made[1], int)):
        raise ConfigError(f"torso {_named(source)} must return (nn.Module, feature size) or an nn.Module, "
                          f"got {made!r:.80}")
    return made


def _feature_size(module: nn.Module, obs_shape, source) -> int:
    out_dim = getattr(module, "out_dim", None)
    if isinstance(out_dim, int):
        return out_dim
    if isinstance(obs_shape, dict):
        raise ConfigError(f"torso {_named(source)} for Dict observations must give its feature size: return "
                          "(module, out_dim) from a factory, or set module.out_dim")
    device = next(iter(module.parameters()), torch.zeros(())).device
    training = module.training
    module.eval()   # batch statistics and dropout neither change the module nor draw random numbers
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            return int(module(torch.zeros(1, *obs_shape, device=device)).shape[-1])
    finally:
        module.train(training)


def _named(source) -> str:
    return repr(source) if isinstance(source, str) else getattr(source, "__name__", type(source).__name__)


def _torso_factory(spec: str):
    import importlib

    module_name, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load torso {spec!r} ({type(e).__name__}: {e}); give module:name of a factory "
                          "importable here (on PYTHONPATH)") from None


def check_conv(conv: str) -> None:
    """ConfigError unless `conv` is a built-in conv torso or an importable `module:name`."""
    if not isinstance(conv, str):
        raise ConfigError(f"--conv must be nature, a3c or a torso factory module:name, got {conv!r:.80}; "
                          "give a module or factory object as make(config, spec, network=...)")
    if ":" in conv:
        _torso_factory(conv)
    elif conv not in CONVS:
        raise ConfigError(f"--conv must be nature, a3c or a torso factory module:name, got {conv!r}")


class ActorCritic(nn.Module):
    """Policy and value heads; `forward(obs) -> (policy_out [*, A], value [*])`.

    Vector observations: separate actor and critic MLPs (CleanRL's PPO). Image
    observations, or any with a torso of the user's (`conv`: see `user_torso`): one
    shared torso with two linear heads. Discrete actions: the
    policy output is logits; continuous: the Gaussian mean, with a state-independent
    `log_std` parameter [A].
    """

    def __init__(self, obs_shape, action_dim: int, continuous: bool, hidden=(64, 64),
                 activation: str = "tanh", conv="nature", init_log_std: float = 0.0):
        super().__init__()
        image = encoder(obs_shape, conv)
        if image is None:
            self.torso = Flatten(obs_shape)
            shapes = obs_shape.values() if isinstance(obs_shape, dict) else [obs_shape]
            d = sum(int(torch.Size(s).numel()) for s in shapes)
            self.actor = mlp(d, action_dim, hidden, activation, out_gain=0.01, head=NarrowLinear)
            self.critic = mlp(d, 1, hidden, activation, out_gain=1.0, head=NarrowLinear)
        else:
            self.torso, d = image
            self.actor = layer_init(Linear(d, action_dim), 0.01)
            self.critic = layer_init(Linear(d, 1), 1.0)
        self.continuous = continuous
        if continuous:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, obs):
        h = self.torso(obs)
        return self.actor(h), self.critic(h).squeeze(-1)
