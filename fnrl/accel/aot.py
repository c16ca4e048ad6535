"""Ahead-of-time compiled acting (and learner steps): one AOTInductor-compiled C++ function.

A `torch.compile`d `act` is fast math behind a slow door: every call goes through
TorchDynamo's frame hook, its guard check and AOTAutograd's runtime wrappers, which cost
more than the math of a 64-64 MLP policy on a few CartPole envs. In
`benchmarks/probes/ppo_breakdown.md` (4 envs x 128 steps, 2-core CPU) acting took
43.7 ms per rollout through `torch.compile` and 14.5 ms through this module. The sampler
calls `act` once per env step, so that door is paid T times per rollout. `AotAct`
exports `act` once (`torch.export`, with the state's leaves as flat
inputs), compiles it with AOTInductor, and afterwards calls the compiled C++ model
directly with a list of tensors:

    act = AotAct(agent.act, keys=ppo.ACT_KEYS, fallback=compiled_act)
    action, extras, carry = act(state, obs, None, True)    # the same contract as agent.act

It serves the calls the sampler makes in training on the CPU (`serves`: CUDA calls go through
`torch.compile` and, with `--cuda-graphs`, CUDA graphs): `carry=None` (feed-forward policies),
`explore=True`, observations of the shape, strides and dtype of the first call, and `extras` a flat
dict of tensors. Every other call (evaluation's `explore=False`, another batch size, a
recurrent carry, or an `act` that cannot be exported) goes to `fallback`, e.g. the same
`act` under `torch.compile`, which then compiles on its first use.

Compiled packages are cached on disk (`FNRL_CACHE_DIR`, default `~/.cache/fnrl`, under
`aoti/`), keyed by the exported graph, its constants, the input shapes and dtypes, the
Inductor options, the torch version and the CPU's vector ISA, so a second run of the same policy loads in
about a second instead of compiling for ~20 s. Randomness: the compiled model draws from
torch's global generator; with Inductor's `fallback_random` option it draws exactly what
eager `act` draws under the same seed.

`compile_traced` serves functions that `torch.export` cannot trace by itself, such as a
whole update with its `torch.func.grad` (`fnrl.learner`'s fused step): traced by `make_fx`
first, then exported, compiled and cached the same way.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch.utils import _pytree as pytree


def serves(device) -> bool:
    """Whether calls on `device` go through AOTInductor models (where a run asks for them,
    `fnrl.accel.AccelOptions.ahead_of_time`): on the CPU.

    On the CPU a model skips TorchDynamo's guards and Python per call, which is what bounds
    small steps there. On a GPU that host time overlaps the kernels, CUDA graphs remove it
    (`fnrl.accel.cudagraphs`), and loading a CUDA model crashed the process (segmentation fault in
    `torch._inductor.aoti_load_package`, torch 2.11 on an H200, `benchmarks/gpu_graphs.md`):
    CUDA calls go through `torch.compile`."""
    return torch.device(device).type == "cpu"


def cache_dir() -> Path:
    """Where compiled acting packages are kept: `$FNRL_CACHE_DIR/aoti` (default `~/.cache/fnrl/aoti`)."""
    return Path(os.environ.get("FNRL_CACHE_DIR", Path.home() / ".cache" / "fnrl")) / "aoti"


class _Flat(torch.nn.Module):
    """`act(state, obs, None, True)` as a function of (obs, *state leaves) -> (action, *extras)."""

    def __init__(self, act: Callable, keys: list, batch_size):
        super().__init__()
        self.act, self.keys, self.batch_size = act, keys, batch_size

    def forward(self, obs, *leaves):
        state = TensorDict(dict(zip(self.keys, leaves)), batch_size=self.batch_size)
        action, extras, _ = self.act(state, obs, None, True)
        return (action, *extras.values())


def _package_key(program: torch.export.ExportedProgram, options: dict) -> str:
    """The program's identity: torch version, the CPU's architecture and vector ISA (a cache in a
    home folder shared by hosts of several CPU kinds serves each its own package), options, the
    code of its graph and of every subgraph (a scan's body, a cond's branches: programs that
    differ only there are different models), its inputs' shapes, strides and dtypes, and its
    constants' values."""
    h = hashlib.sha256()
    cpu = f"{platform.machine()}|{torch.backends.cpu.get_cpu_capability()}"
    h.update(f"{torch.__version__}|{cpu}|{sorted(options.items())}".encode())
    for name, module in program.graph_module.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            h.update(f"|{name}|{module.code}".encode())
    for node in program.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            stride = val.stride() if torch.is_tensor(val) else None
            h.update(f"{node.name}:{getattr(val, 'shape', None)}:{stride}:{getattr(val, 'dtype', None)}".encode())
    for name, value in sorted(program.constants.items()):
        h.update(name.encode())
        if torch.is_tensor(value):
            h.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def compile_package(program: torch.export.ExportedProgram, options: dict) -> str:
    """The path of `program` compiled by AOTInductor with `options`: from the cache, or compiled
    now and written there atomically; processes that want the same package at the same time
    (data-parallel ranks, test workers) wait for the first one's compile (a file lock)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    key = _package_key(program, options)
    path = directory / f"{key}.pt2"
    if path.exists():
        return str(path)
    with open(directory / f".{key}.lock", "w") as lock:   # one process compiles, the others wait and load
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pt2")
            os.close(fd)
            try:
                torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=dict(options))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
    return str(path)


def warn_fallback(subject: str, error: Exception, stacklevel: int = 3, instead: str = "using torch.compile") -> None:
    """One warning that `subject` ("acting is", ...) runs `instead` another way, naming the error
    that stopped its ahead-of-time build (its first line)."""
    first = str(error).splitlines()[0][:200] if str(error) else ""
    warnings.warn(f"{subject} not ahead-of-time compiled ({type(error).__name__}: {first}); {instead}",
                  stacklevel=stacklevel)


class _Traced(torch.nn.Module):
    """An fx graph (of `make_fx`) as a module, for torch.export."""

    def __init__(self, graph_module: torch.fx.GraphModule):
        super().__init__()
        self.graph_module = graph_module

    def forward(self, *args):
        return self.graph_module(*args)


def compile_traced(fn: Callable, args: list[torch.Tensor], options: dict) -> Callable[[list], list]:
    """`fn(*args)` (tensors in, a tuple of tensors out) as an AOTInductor model: returns
    `run(list of tensors) -> list of tensors`.

    `fn` is traced to ATen ops by `make_fx` on fake tensors, which goes through `torch.func`
    transforms (`grad`, `vmap`) where `torch.export` alone fails, then exported and compiled
    (`compile_package`: cached on disk like the acting models). Writes into the inputs
    (a donated state's `update_`) stay in the model: a call updates those tensors in place.
    Raises whatever tracing or compiling raises; the caller decides on a fallback.
    """
    from torch._export.utils import _compiling_state_context
    from torch.fx.experimental.proxy_tensor import make_fx

    # traced as torch.compile traces: torch.compiler.is_compiling() is True in `fn` (fnrl's
    # compiled forms: torch.cond / scan, the fused tanh); tensors `fn` captures become constants.
    # TorchDynamo traces a scan's body: static, so that a Python int it closes over (a schedule's
    # length) stays a constant even where another model's trace saw it with another value
    with torch.random.fork_rng(), _compiling_state_context(), \
            torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        graph_module = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    program = torch.export.export(_Traced(graph_module), tuple(args), strict=False)
    runner = torch._inductor.aoti_load_package(compile_package(program, options))
    loader = getattr(runner, "loader", None)
    return loader.run if loader is not None else (lambda inputs: runner(*inputs))


class AotFunction:
    """`fn(*args)` as an AOTInductor model (`compile_traced`) called with the leaves of `args`.

    args: tensors and TensorDicts (anything else `fn` needs is bound in it). `fn` returns a
    tensor, a flat dict (or TensorDict) of tensors, a tuple of tensors and TensorDicts (nested
    ones too), or None, and may write into its inputs in place: the model makes the same
    writes. Built for the first call's args; a later call passes args of the same structure,
    shapes, strides and dtypes (`matches` tells; the leaves are read at every call, so other
    tensors in the same places are fine), and gets a tensor, a TensorDict [] of the dict's
    entries, the tuple rebuilt (its TensorDicts with their batch sizes), or None. Raises at
    construction what tracing or compiling raises, and ValueError where two inputs share
    memory (traced as separate tensors, a write into one would not show in the other)."""

    def __init__(self, fn: Callable, args: tuple, options: dict | None = None):
        self.keys = []   # per arg: None for a tensor, the leaf keys of a TensorDict
        for a in args:
            if not (torch.is_tensor(a) or isinstance(a, TensorDictBase)):
                raise TypeError(f"AotFunction takes tensors and TensorDicts, got {type(a).__name__}")
            self.keys.append(None if torch.is_tensor(a) else list(a.keys(include_nested=True, leaves_only=True)))
        self.readers = [None if keys is None else [leaf_reader(k) for k in keys] for keys in self.keys]
        self.out_keys: list | None = None   # None: a tensor; a list: the dict's keys
        self.out_spec = None                # a tuple's pytree structure
        self.returns_none = False

        def flat(*leaves):
            leaves, rebuilt = list(leaves), []
            for a, keys in zip(args, self.keys):
                if keys is None:
                    rebuilt.append(leaves.pop(0))
                    continue
                td = a.empty(recurse=True)   # a's nesting and batch sizes, without its tensors
                for key in keys:
                    td.set(key, leaves.pop(0))
                rebuilt.append(td)
            out = fn(*rebuilt)
            if out is None:
                self.returns_none = True
                return ()
            if torch.is_tensor(out):
                return (out,)
            if isinstance(out, tuple):
                values, self.out_spec = pytree.tree_flatten(out)
                if not all(torch.is_tensor(v) for v in values):
                    raise TypeError("a returned tuple holds tensors and TensorDicts only")
                return tuple(values)
            if any(not torch.is_tensor(v) for v in out.values()):
                raise TypeError("only a tensor or a flat dict of tensors is returned")
            self.out_keys = list(out.keys())
            return tuple(out.values())

        inputs = self.leaves(args)
        memory = [x.untyped_storage().data_ptr() for x in inputs if x.numel()]
        if len(set(memory)) < len(memory):
            raise ValueError("two of the inputs share memory")
        self.layout = _layout(inputs)
        self.run = compile_traced(flat, inputs, dict(options or {}))

    def matches(self, *args) -> bool:
        """Whether `args` have the built call's structure and the layout of its tensors
        (shapes, strides, dtypes, devices), which the model reads its inputs with."""
        try:
            return _layout(self.leaves(args)) == self.layout
        except (AttributeError, KeyError, TypeError):
            return False

    def leaves(self, args: tuple) -> list[torch.Tensor]:
        out = []
        for a, readers in zip(args, self.readers):
            if readers is None:
                out.append(a)
            else:
                out.extend(read(a) for read in readers)
        return out

    def __call__(self, *args):
        values = self.run(self.leaves(args))
        if self.returns_none:
            return None
        if self.out_spec is not None:
            return pytree.tree_unflatten(list(values), self.out_spec)
        if self.out_keys is None:
            return values[0]
        return TensorDict(dict(zip(self.out_keys, values)), batch_size=[])


def _layout(tensors: list[torch.Tensor]) -> list[tuple]:
    return [(t.shape, t.stride(), t.dtype, t.device) for t in tensors]


def function_or_none(subject: str, fn: Callable, args: tuple, options: dict | None = None) -> AotFunction | None:
    """`AotFunction(fn, args, options)`, or None after one `warn_fallback(subject, ...)` where it
    cannot be built (any trace, export or compile failure): the caller then uses torch.compile."""
    try:
        return AotFunction(fn, args, options)
    except Exception as e:   # noqa: BLE001 - whatever stops the build means: the torch.compile path
        warn_fallback(subject, e, stacklevel=4)
        return None


def leaf_reader(key) -> Callable[[TensorDict], torch.Tensor]:
    """`td -> td.get(key)` through the TensorDicts' own dicts (~0.3 us instead of ~6 us a call);
    `get` where a level is not a plain TensorDict."""
    path = (key,) if isinstance(key, str) else tuple(key)

    def leaf(td):
        try:
            out = td
            for k in path:
                out = out._tensordict[k]
            return out
        except (AttributeError, KeyError):
            return td.get(key)

    return leaf


class AotAct:
    """`act(state, obs, carry, explore) -> (action, extras, carry)` served by an AOTInductor model.

    keys: the state entries `act` reads (an algorithm's `SPEC.act_keys`; None for the whole state);
        they become the model's flat inputs, read from the state on every call.
    fallback: called with the same arguments for the calls the model does not serve (see the
        module docstring) and, with a warning, for good if `act` cannot be exported.
    options: Inductor options for the compile (e.g. `{"fallback_random": True}`).

    The model is exported and compiled at the first call it serves (or loaded from the cache).
    Tensors `act` reads from anywhere but `state` (a closure, a module attribute) are baked
    into the model as constants: whatever changes between calls must live in the state.
    """

    def __init__(self, act: Callable, keys, fallback: Callable, options: dict | None = None):
        self.act, self.fallback = act, fallback
        self.select = None if keys is None else tuple(keys)
        self.options = dict(options or {})
        self.run = None          # the model: list of tensors -> list of tensors
        self.failed = False
        self.leaf_keys: list = []
        self.readers: list = []
        self.extra_keys: tuple = ()
        self.obs_meta = None

    def _build(self, state: TensorDict, obs: torch.Tensor) -> None:
        chosen = state if self.select is None else state.select(*self.select, strict=False)
        self.leaf_keys = list(chosen.keys(include_nested=True, leaves_only=True))
        self.readers = [leaf_reader(k) for k in self.leaf_keys]
        leaves = [chosen.get(k) for k in self.leaf_keys]
        flat = _Flat(self.act, self.leaf_keys, chosen.batch_size)
        devices = [obs.device] if obs.device.type == "cuda" else []
        try:   # the random numbers drawn here are given back: the first served call draws what eager would
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                _, extras, carry = self.act(chosen, obs, None, True)   # the output's structure
                if carry is not None or not all(torch.is_tensor(v) for v in extras.values()):
                    raise TypeError("only feed-forward policies whose extras are tensors are served")
                program = torch.export.export(flat, (obs, *leaves), strict=False)
            # hashing fails on a state tensor captured as a constant (one that escaped a vmap): not servable
            path = compile_package(program, self.options)
        except Exception as e:   # noqa: BLE001 - any export or compile failure means: act the usual way
            warn_fallback("acting is", e, stacklevel=4)
            self.failed = True
            return
        runner = torch._inductor.aoti_load_package(path)
        loader = getattr(runner, "loader", None)
        self.run = loader.run if loader is not None else (lambda args: runner(*args))
        self.extra_keys = tuple(extras.keys())
        self.obs_meta = (obs.shape, obs.stride(), obs.dtype, obs.device)

    def serves(self, obs, carry, explore) -> bool:
        return (carry is None and explore and not self.failed and torch.is_tensor(obs) and serves(obs.device)
                and (self.obs_meta is None or (obs.shape, obs.stride(), obs.dtype, obs.device) == self.obs_meta))

    def __call__(self, state: TensorDict, obs, carry=None, explore: bool = True):
        if not self.serves(obs, carry, explore):
            return self.fallback(state, obs, carry, explore)
        if self.run is None:
            self._build(state, obs)
            if self.failed:
                return self.fallback(state, obs, carry, explore)
        outs = self.run([obs, *[read(state) for read in self.readers]])
        return outs[0], dict(zip(self.extra_keys, outs[1:])), None
