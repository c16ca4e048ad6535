"""The docs point at things that exist: every relative link in the README and the docs pages,
and every repository file that the docs, the benchmark pages and fnrl's docstrings name in a
code span (`benchmarks/probes/threads.md`, `tests/test_resume.py`), is a file in the checkout.
The docs site's own build (`mkdocs build`, strict) checks the links between its pages and the
API reference."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "benchmarks").rglob("README.md")), ROOT / "benchmarks" / "learning.md"]
SOURCES = sorted((ROOT / "fnrl").rglob("*.py"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"`((?:benchmarks|tests|fnrl|docs|experiments)/[\w./-]+\.(?:md|py|toml|png|sh))`")


def _relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", [p for p in PAGES if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [t for t in _relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("path", [p for p in PAGES if p.exists()] + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_repository_files_exist(path):
    named = {t for t in REPO_PATH.findall(path.read_text()) if not re.search(r"\b[A-Z]{3,}\b", t)}   # not ALGO.toml
    missing = sorted(t for t in named if not (ROOT / t).exists())
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


def test_readme_within_budget():
    """The README is the front page: what fnrl is, the Quickstart, a tour, the results, links."""
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/"


def test_the_project_speaks_of_itself_only():
    """No page or source narrates how the project was made (work periods, tracker numbers)."""
    pattern = re.compile(r"(?i:\bsession \d+|\bsession's\b|\bthis session\b|\bissue #?\d+)|PEERS\.md|DESIGN\.md")
    offenders = []
    for path in [p for p in PAGES if p.exists()] + SOURCES + sorted((ROOT / "tests").glob("*.py")):
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("page", ["README.md", "docs/learning.md"])
def test_the_learning_table_is_the_matrix(page):
    """Every row of the page's learning table reads what `benchmarks/results/learning.json` holds for
    its cell (IQM, interval, worst seed, seeds at the threshold), and every cell has a row."""
    import json

    cells = json.loads((ROOT / "benchmarks" / "results" / "learning.json").read_text())["cells"]
    cells = cells if isinstance(cells, list) else list(cells.values())
    expected = {(c["algo"], c["env"]): f"{c['iqm']:.0f} [{c['ci'][0]:.0f}, {c['ci'][1]:.0f}] | {c['worst']:.0f} | "
                                       f"{c['reached']}/8" for c in cells}
    row = re.compile(r"^\| ([\w-]+) \| ([\w-]+-v\d) \| [\d.]+[kM] \| (-?\d+ \[-?\d+, -?\d+\] \| -?\d+ \| \d/8) \|",
                     re.M)
    found = {(name.lower().replace("-", ""), env): cells_text
             for name, env, cells_text in row.findall((ROOT / page).read_text())}
    assert found == expected
