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

Handing models from one process to another (`fnrl.accel.tiered`): inside `recording()` every
model built is noted by its call signature (`call_signature`: what it computes, the layout of its
inputs, the options); inside `provided(packages)` a model whose signature is there is loaded from
that package without tracing or exporting anything. The signature does not identify the code, so
packages are only provided to the same function, built from the same configuration.
"""
from __future__ import annotations

import contextlib
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

from fnrl.tensordicts import leaf_reader, unchecked_tensordict


def serves(device) -> bool:
    """Whether calls on `device` go through AOTInductor models (where a run asks for them,
    `fnrl.accel.AccelOptions.ahead_of_time`): on the CPU.

    On the CPU a model skips TorchDynamo's guards and Python per call, which is what bounds
    small steps there. On a GPU that host time overlaps the kernels, CUDA graphs remove it
    (`fnrl.accel.cudagraphs`), and loading a CUDA model crashed the process (segmentation fault in
    `torch._inductor.aoti_load_package`, torch 2.11 on an H200, `benchmarks/gpu_graphs.md`):
    CUDA calls go through `torch.compile`."""
    return torch.device(device).type == "cpu"


_recorded: dict[str, str] | None = None   # call signature -> package, while `recording()`
_provided: tuple[dict[str, str], bool] = ({}, False)   # (call signature -> package, strict), while `provided(...)`


class NotProvided(LookupError):
    """A model was asked for inside `provided(..., strict=True)` that the packages do not hold."""


@contextlib.contextmanager
def recording():
    """A dict that fills with `{call signature: package path}` for every model built (or loaded)
    inside the block."""
    global _recorded
    before, _recorded = _recorded, {}
    try:
        yield _recorded
    finally:
        _recorded = before


@contextlib.contextmanager
def provided(packages: dict[str, str], strict: bool = False):
    """Inside the block, a model whose call signature is in `packages` is loaded from its package,
    skipping the trace, export and compile that would build it; with `strict`, building any other
    model raises `NotProvided` instead (where a build would cost seconds that the caller cannot
    spend)."""
    global _provided
    before, _provided = _provided, ({**_provided[0], **packages}, strict)
    try:
        yield
    finally:
        _provided = before


def _provided_package(signature: str, name: str) -> str | None:
    path = _provided[0].get(signature)
    if path is None and _provided[1]:
        raise NotProvided(f"no package provided ({name})")
    return path


def call_signature(name: str, inputs: list[torch.Tensor], options: dict, keys=()) -> str:
    """What tells two models of one function apart: its name, the layout of its flat inputs
    (shapes, strides, dtypes, devices) and their keys, the Inductor options, torch, the CPU and
    torch's intra-op threads (Inductor's kernels are written for that many)."""
    cpu = f"{platform.machine()}|{torch.backends.cpu.get_cpu_capability()}|{torch.get_num_threads()}"
    text = f"{name}|{torch.__version__}|{cpu}|{sorted(options.items())}|{list(keys)}|{_layout(inputs)}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _note(signature: str, path: str) -> None:
    if _recorded is not None:
        _recorded[signature] = path


def load_package(path: str) -> Callable[[list], list]:
    """`run(list of tensors) -> list of tensors` of the AOTInductor package at `path`.

    Loaded by torch's package loader itself: `aoti_load_package` first probes the CPU's vector
    ISAs by compiling test programs (~1.5 s, once per process) only to warn where the package was
    built for another one, which its key (`_package_key`) already rules out."""
    try:
        return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1).run
    except (AttributeError, TypeError):   # another torch's loader: the public way
        runner = torch._inductor.aoti_load_package(path)
        loader = getattr(runner, "loader", None)
        return loader.run if loader is not None else (lambda inputs: runner(*inputs))


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
    home folder shared by hosts of several CPU kinds serves each its own package), torch's intra-op
    threads (Inductor splits its loops for that many), options, the
    code of its graph and of every subgraph (a scan's body, a cond's branches: programs that
    differ only there are different models), its inputs' shapes, strides and dtypes, and its
    constants' values."""
    h = hashlib.sha256()
    cpu = f"{platform.machine()}|{torch.backends.cpu.get_cpu_capability()}|threads {torch.get_num_threads()}"
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
    `run(list of tensors) -> list of tensors` (`load_package` of `trace_and_package`)."""
    return load_package(trace_and_package(fn, args, options))


def trace_and_package(fn: Callable, args: list[torch.Tensor], options: dict) -> str:
    """The package path of `fn(*args)` (tensors in, a tuple of tensors out) as an AOTInductor model.

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
    return compile_package(program, options)


class AotFunction:
    """`fn(*args)` as an AOTInductor model (`compile_traced`) called with the leaves of `args`.

    args: tensors and TensorDicts (anything else `fn` needs is bound in it). `fn` returns a
    tensor, a flat dict (or TensorDict) of tensors, a tuple of tensors and TensorDicts (nested
    ones too), or None, and may write into its inputs in place: the model makes the same
    writes. Built for the first call's args; a later call passes args of the same structure,
    shapes, strides and dtypes (`matches` tells; the leaves are read at every call, so other
    tensors in the same places are fine), and gets a tensor, a TensorDict [] of the dict's
    entries, the tuple rebuilt (its TensorDicts with their batch sizes), or None; the keys of
    what it returns in the order of its first TensorDict argument's (`_canonical`). Raises at
    construction what tracing or compiling raises, and ValueError where two inputs share
    memory (traced as separate tensors, a write into one would not show in the other).
    name: what the model computes, in its call signature (see the module docstring); a model
    `provided` under it is loaded, its output's structure taken from one eager call on copies."""

    def __init__(self, fn: Callable, args: tuple, options: dict | None = None, name: str = "function"):
        self.keys = []   # per arg: None for a tensor, the leaf keys of a TensorDict
        for a in args:
            if not (torch.is_tensor(a) or isinstance(a, TensorDictBase)):
                raise TypeError(f"AotFunction takes tensors and TensorDicts, got {type(a).__name__}")
            self.keys.append(None if torch.is_tensor(a) else list(a.keys(include_nested=True, leaves_only=True)))
        self.readers = [None if keys is None else [leaf_reader(k) for k in keys] for keys in self.keys]
        self.out_keys: list | None = None   # None: a tensor; a list: the dict's keys
        self.out_spec = None                # a tuple's pytree structure
        self.returns_none = False
        self.rebuild = None                 # the tuple's builder (`_rebuilder`), made at the first call

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
            out = _canonical(fn(*rebuilt), next((a for a in rebuilt if isinstance(a, TensorDictBase)), None))
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
        options = dict(options or {})
        signature = call_signature(name, inputs, options, self.keys)
        path = _provided_package(signature, name)
        if path is None:
            path = trace_and_package(flat, inputs, options)
        else:   # the output's structure, from the function itself
            with torch.random.fork_rng(devices=[x.device for x in inputs if x.device.type == "cuda"][:1]):
                flat(*[x.clone() for x in inputs])
        _note(signature, path)
        self.run = load_package(path)

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
        return self._output(self.run(self.leaves(args)))

    def call_if_matches(self, *args) -> tuple[bool, object]:
        """`(True, self(*args))` where `args` match the built call (`matches`), else `(False, None)`,
        reading the inputs' leaves once for both."""
        try:
            leaves = self.leaves(args)
            matched = _layout(leaves) == self.layout
        except (AttributeError, KeyError, TypeError):
            matched = False
        return (True, self._output(self.run(leaves))) if matched else (False, None)

    def _output(self, values):
        if self.returns_none:
            return None
        if self.out_spec is not None:
            if self.rebuild is None:   # the first call: pytree's unflatten, and a faster builder for later calls
                out = pytree.tree_unflatten(list(values), self.out_spec)
                self.rebuild = _rebuilder(out, values, self.out_spec)
                return out
            return self.rebuild(values)
        if self.out_keys is None:
            return values[0]
        return TensorDict(dict(zip(self.out_keys, values)), batch_size=[])


def _rebuilder(example, values, spec) -> Callable[[list], object]:
    """A function of a model's flat outputs that builds `example`'s structure around them (a tuple
    of tensors and TensorDicts, nested ones with their batch sizes and devices) in pytree's leaf
    order, with the TensorDicts made without tensordict's checks of every value
    (`TensorDict._new_unsafe`, where tensordict has it): `pytree.tree_unflatten`'s result at a
    fraction of its Python. It is checked once against `example`, `values` unflattened with
    `spec`; where it differs (a structure it does not know), pytree's unflatten stays."""
    def builder(node):
        if torch.is_tensor(node):
            return lambda it: next(it)
        if type(node) is tuple:
            parts = [builder(n) for n in node]
            return lambda it: tuple(part(it) for part in parts)
        if type(node) is TensorDict:
            keys = list(node.keys())
            parts = [builder(node.get(k)) for k in keys]
            batch_size, device = node.batch_size, node.device
            return lambda it: unchecked_tensordict({k: part(it) for k, part in zip(keys, parts)}, batch_size,
                                                   device)
        raise TypeError(type(node).__name__)

    def unflatten(flat):
        return pytree.tree_unflatten(list(flat), spec)

    try:
        build = builder(example)
        rebuilt = build(iter(values))
        leaves, rebuilt_spec = pytree.tree_flatten(rebuilt)
    except (TypeError, StopIteration, RuntimeError):   # RuntimeError: a StopIteration inside a tuple's builder
        return unflatten
    if rebuilt_spec != spec or len(leaves) != len(values) or any(a is not b for a, b in zip(leaves, values)):
        return unflatten
    return lambda flat: build(iter(flat))


def _canonical(out, reference=None):
    """`out` with the keys of every dict and TensorDict in it in a canonical order: a TensorDict's
    in the order of `reference`'s (a TensorDict input, recursively: the state stays in the order it
    came in), keys `reference` lacks after them, sorted. The order of the model's outputs then
    depends on what `fn` returns, not on the order it built it in (which differs between fnrl's
    eager and compiled forms of one update)."""
    if isinstance(out, TensorDictBase):
        known = list(reference.keys()) if isinstance(reference, TensorDictBase) else []
        keys = [k for k in known if k in out.keys()] + sorted(k for k in out.keys() if k not in known)
        return TensorDict({k: _canonical(out.get(k), reference.get(k) if k in known else None) for k in keys},
                          batch_size=out.batch_size, device=out.device)
    if isinstance(out, dict):
        return {k: out[k] for k in sorted(out)}
    if isinstance(out, tuple):
        return tuple(_canonical(o, reference) for o in out)
    return out


def _layout(tensors: list[torch.Tensor]) -> list[tuple]:
    return [(t.shape, t.stride(), t.dtype, t.device) for t in tensors]


def function_or_none(subject: str, fn: Callable, args: tuple, options: dict | None = None) -> AotFunction | None:
    """`AotFunction(fn, args, options)`, or None after one `warn_fallback(subject, ...)` where it
    cannot be built (any trace, export or compile failure): the caller then uses torch.compile."""
    try:
        return AotFunction(fn, args, options, name=subject)
    except NotProvided:
        raise
    except Exception as e:   # noqa: BLE001 - whatever stops the build means: the torch.compile path
        warn_fallback(subject, e, stacklevel=4)
        return None


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
        signature = call_signature("act", [obs, *leaves], self.options, self.leaf_keys)
        path = _provided_package(signature, "acting")
        try:   # the random numbers drawn here are given back: the first served call draws what eager would
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                _, extras, carry = self.act(chosen, obs, None, True)   # the output's structure
                if carry is not None or not all(torch.is_tensor(v) for v in extras.values()):
                    raise TypeError("only feed-forward policies whose extras are tensors are served")
                program = torch.export.export(flat, (obs, *leaves), strict=False) if path is None else None
            # hashing fails on a state tensor captured as a constant (one that escaped a vmap): not servable
            path = path or compile_package(program, self.options)
        except Exception as e:   # noqa: BLE001 - any export or compile failure means: act the usual way
            warn_fallback("acting is", e, stacklevel=4)
            self.failed = True
            return
        _note(signature, path)
        self.run = load_package(path)
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
