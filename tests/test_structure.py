"""The package's shape: no import circles, no private names across modules, short functions, no
module switches, and every algorithm module true to its declared contract (`fnrl.algos.spec`)."""
from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

from fnrl import algos
from fnrl.algos.spec import AlgorithmSpec, check_module

PACKAGE = Path(__file__).resolve().parents[1] / "fnrl"
MAX_FUNCTION = 100
"""The most lines any function of the package may have."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]):
    """(imported fnrl module, names taken from it) for every import in `path`, lazy ones included."""
    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fnrl":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full, ()) if full in modules else (owner(node.module), (alias.name,))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fnrl":
                    yield owner(alias.name), ()


def test_no_import_circles():
    modules = _modules()
    graph = {m: {t for t, _ in _imports(p, modules) if t != m and t in modules} for m, p in modules.items()}
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_module_imports_another_modules_private_names():
    modules = _modules()
    taken = [(str(p.relative_to(PACKAGE.parent)), t, n) for m, p in modules.items() for t, names in _imports(p, modules)
             for n in names if n.startswith("_") and t != m]
    assert taken == []


def test_functions_are_short_and_the_serial_loop_fits_one_file():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.name} ({lines} lines)")
    assert long == []
    assert len((PACKAGE / "loops" / "serial.py").read_text().splitlines()) <= 150


def test_algorithm_files_hold_no_speed_plumbing():
    """An algorithm says what its update computes; `fnrl.accel` decides how it runs."""
    modules = _modules()
    for path in (PACKAGE / "algos").glob("*.py"):
        imported = {t for t, _ in _imports(path, modules)}
        assert not imported & {"fnrl.accel.aot", "fnrl.accel.cudagraphs"}, path.name


@pytest.mark.parametrize("name", sorted(algos.ALGOS))
def test_every_algorithm_declares_its_spec(name):
    spec = algos.spec(name)   # load() checks the module against the contract
    assert isinstance(spec, AlgorithmSpec)
    assert spec.off_policy == (spec.replay is not None)


def test_spec_rejects_what_no_loop_runs():
    with pytest.raises(ValueError, match="kind"):
        AlgorithmSpec(kind="model_based")
    with pytest.raises(ValueError, match="runtime"):
        AlgorithmSpec(kind="on_policy", runtime="distributed")
    with pytest.raises(ValueError, match="replay"):
        AlgorithmSpec(kind="off_policy")
    with pytest.raises(ValueError, match="replay"):
        AlgorithmSpec(kind="on_policy", replay="row")


def test_check_module_names_what_an_algorithm_lacks():
    from fnrl.algos import ppo

    bare = types.ModuleType("bare")
    with pytest.raises(TypeError, match="declares no SPEC"):
        check_module("bare", bare)
    bare.SPEC, bare.make, bare.validate = ppo.SPEC, ppo.make, ppo.validate
    with pytest.raises(TypeError, match="no Config dataclass"):
        check_module("bare", bare)
    bare.Config = ppo.Config
    check_module("bare", bare)
    bare.SPEC = AlgorithmSpec(kind="on_policy", sweepable=("learning_rate", "momentum"))
    with pytest.raises(TypeError, match="sweepable fields that its Config lacks: momentum"):
        check_module("bare", bare)
    bare.SPEC, bare.make = AlgorithmSpec(kind="on_policy", make_options=("compile",)), lambda config, spec: None
    with pytest.raises(TypeError, match="takes no compile, ahead_of_time"):
        check_module("bare", bare)
    with pytest.raises(ValueError, match="make_options"):
        AlgorithmSpec(kind="on_policy", make_options=("jit",))


SCOPED_GLOBALS = {
    ("nets/core.py", "_VMAPPED_ROWS"),         # `vmapped_rows(R)`: a context manager around tracing
    ("nets/core.py", "_PLAIN"),                # `plain_products()`: a context manager around tracing
    ("algos/common.py", "_gradient_reducer"),  # `reducing_gradients(reducer)`: a context manager
    ("accel/aot.py", "_recorded"),             # `recording()`: a context manager
    ("accel/aot.py", "_provided"),             # `provided(packages)`: a context manager
    ("replay/buffer.py", "_LAST_CHECKED"),     # caches: what was checked or compiled already
    ("replay/buffer.py", "_COMPILED_WRITE"),
    ("replay/buffer.py", "_COMPILED_DRAW"),
}


def test_no_module_switch_is_flipped_from_outside():
    """Options are passed (`fnrl.accel.AccelOptions`, the plan), not module globals that another
    module or a probe sets: the only rebound globals are scoped contexts and caches."""
    rebound = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                rebound |= {(str(path.relative_to(PACKAGE).as_posix()), name) for name in node.names}
    assert rebound == SCOPED_GLOBALS
    from fnrl.accel import aot, compiled

    for module, name in ((aot, "ENABLED"), (compiled, "SKIP_GUARDS"), (compiled, "FUSED_LEARNER")):
        assert not hasattr(module, name)
