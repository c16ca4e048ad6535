"""Every package that fnrl or its tests import is declared in pyproject.toml.

A module of fnrl may import at its top only the project's dependencies; inside a function (an
optional feature) also a package of one of its extras. A test module may import at its top the
dependencies and the `test` extra; inside a test, any extra. The standard library and the
project itself aside, anything else is a package a user's fresh install lacks.
"""
import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"fnrl", "tests", "experiments"}   # experiments: the repository's examples, which tests run
DISTRIBUTION_OF = {"PIL": "pillow", "cv2": "opencv-python-headless", "yaml": "pyyaml"}
"""Import names whose distribution is named otherwise, for packages that may not be installed here."""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set, dict]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements):
        return {_normalized(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in requirements}

    return names(project["dependencies"]), {k: names(v) for k, v in project["optional-dependencies"].items()}


@functools.lru_cache(maxsize=1)
def _installed() -> dict:
    """Import name -> distributions, of everything installed (a scan of every package's metadata)."""
    return packages_distributions()


def _distribution(module: str) -> str:
    installed = _installed().get(module)
    return _normalized(installed[0] if installed else DISTRIBUTION_OF.get(module, module))


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level package, imported inside a function, line) of each third-party import of `path`."""
    tree = ast.parse(path.read_text())
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top not in sys.stdlib_module_names and top not in PROJECT:
                out.append((top, id(node) in inside, node.lineno))
    return out


@pytest.mark.parametrize("folder", ["fnrl", "tests"])
def test_every_import_is_declared(folder):
    core, extras = _declared()
    at_top = core | (extras["test"] if folder == "tests" else set())
    anywhere = at_top | set().union(*extras.values())
    missing = [f"{path.relative_to(ROOT)}:{line} imports {top} ({_distribution(top)})"
               for path in sorted((ROOT / folder).rglob("*.py"))
               for top, in_function, line in _imports(path)
               if _distribution(top) not in (anywhere if in_function else at_top)]
    assert not missing, "undeclared in pyproject.toml: " + "; ".join(missing)


def test_the_check_sees_an_undeclared_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import numpy\nimport scipy.stats\n\ndef f():\n    import yaml\n")
    assert _imports(module) == [("numpy", False, 1), ("scipy", False, 2), ("yaml", True, 5)]
    core, extras = _declared()
    assert "scipy" not in core | set().union(*extras.values())


USED_THROUGH = {"tensorboard": "torch.utils.tensorboard"}
"""Dependencies that fnrl uses through another package's module rather than by importing them."""


def test_every_dependency_is_used():
    """Each declared dependency is imported somewhere in fnrl (or used through the module named in
    USED_THROUGH): a dependency nothing uses is a download every user pays for."""
    core, _ = _declared()
    sources = sorted((ROOT / "fnrl").rglob("*.py"))
    imported = {_distribution(top) for path in sources for top, _, _ in _imports(path)}
    text = "\n".join(path.read_text() for path in sources)
    unused = sorted(d for d in core if d not in imported and not (d in USED_THROUGH and USED_THROUGH[d] in text))
    assert not unused, f"declared in pyproject.toml but never imported by fnrl: {unused}"
