"""TorchDynamo imported only by a process that compiles.

tensordict marks a few functions for TorchDynamo when it is imported (`torch.compiler.allow_in_graph`
on functorch's batching calls and `_foreach_copy_`, `assume_constant_result` on one of its own),
and each mark imports `torch._dynamo`: most of tensordict's import time, paid by every eager run
and every tool that never compiles. `install()` (called by `fnrl/__init__.py`, importing nothing
itself) puts a finder on `sys.meta_path` that

- imports tensordict with those marks taken without TorchDynamo: `assume_constant_result`
  sets the attribute TorchDynamo's own sets, `allow_in_graph` is kept to be made;
- when anything imports `torch._dynamo` (`torch.compile`, `torch.export`, a test), makes the kept
  marks right after its module ran, with fnrl's TorchDynamo settings (`settings`), and leaves
  `sys.meta_path`.

So a compiled function sees exactly the marks it would have seen, whichever import came first. Where
`torch._dynamo` is already imported when fnrl is, the settings are applied at once.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_kept: list = []   # the functions tensordict asked `allow_in_graph` for, marked when TorchDynamo loads


def settings(dynamo) -> None:
    """fnrl's TorchDynamo settings, applied once per process when `torch._dynamo` is imported.

    Every config compiles the same closures (one code object per function of `make`) with static
    shapes, so one process that trains or tests many configs needs more than Dynamo's default of 8
    graphs per function; past the limit a fullgraph compile fails outright."""
    dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 64)


def _keep(fn):
    _kept.append(fn)
    return fn


def _mark_constant(fn):
    fn._dynamo_marked_constant = True   # what `torch._dynamo.assume_constant_result` does
    return fn


def _after(spec, then):
    """`spec` whose module runs `then(module)` once it has run."""
    run = spec.loader.exec_module

    def exec_module(module):
        run(module)
        then(module)

    spec.loader.exec_module = exec_module
    return spec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in ("tensordict", "torch._dynamo"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        if name == "torch._dynamo":
            sys.meta_path.remove(self)
            return _after(spec, _dynamo_loaded)
        import torch.compiler
        marks = torch.compiler.allow_in_graph, torch.compiler.assume_constant_result
        torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = _keep, _mark_constant
        run = spec.loader.exec_module

        def exec_module(module):
            try:
                run(module)
            finally:
                torch.compiler.allow_in_graph, torch.compiler.assume_constant_result = marks

        spec.loader.exec_module = exec_module
        return spec


def _dynamo_loaded(dynamo) -> None:
    for fn in _kept:
        dynamo.allow_in_graph(fn)
    _kept.clear()
    settings(dynamo)


def install() -> None:
    """Put the finder on `sys.meta_path`, or apply `settings` where TorchDynamo is already loaded."""
    if "torch._dynamo" in sys.modules:
        settings(sys.modules["torch._dynamo"])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
