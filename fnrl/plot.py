"""`fnrl plot`: learning curves of many runs, grouped by config, with mean and spread over seeds.

    fnrl plot runs/grid_cartpole --out curves.png              # every progress.csv below
    fnrl plot runs/a runs/b --y eval_return_mean --band std --group-by none

A run is a folder holding `progress.csv` (and, written by `fnrl train`, `config.json`).
Runs whose config.json is equal except for the seed form one group, drawn as the mean
over its runs and a band (min-max, or mean +- std) against env steps. A progress.csv
with a `seed` column (many seeds trained in one process) counts as one run per seed.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from fnrl.errors import ConfigError
from fnrl.logger import csv_value, is_finite_number, plot_curves


def find_runs(paths) -> list[Path]:
    """Run folders (those holding progress.csv) among `paths` and below them, sorted."""
    found = set()
    for p in map(Path, paths):
        if not p.exists():
            raise ConfigError(f"{p} does not exist")
        if p.is_file():
            if p.name != "progress.csv":
                raise ConfigError(f"{p} is not a progress.csv or a folder")
            found.add(p.parent)
        else:
            found.update(f.parent for f in p.rglob("progress.csv"))
    if not found:
        raise ConfigError(f"no progress.csv under {', '.join(map(str, paths))}")
    return sorted(found)


def read_run(folder: Path) -> tuple[dict | None, list[list[dict]]]:
    """(config without its seed, or None without config.json; the run's rows, split by a seed
    column, one per env_steps value in increasing order: the last one logged)."""
    with open(folder / "progress.csv", newline="") as f:
        rows = [{k: csv_value(v) for k, v in r.items()} for r in csv.DictReader(f)]
    per_seed: dict = {}
    for r in rows:  # a resumed run repeats the rows logged after its last checkpoint: keep the latest
        per_seed.setdefault(r.get("seed"), {})[r["env_steps"]] = r
    config = None
    if (folder / "config.json").exists():
        config = json.loads((folder / "config.json").read_text())
        config.pop("seed", None)
        if isinstance(config.get("config"), dict):
            config["config"].pop("seed", None)
    return config, [[by_step[k] for k in sorted(by_step)] for by_step in per_seed.values()]


def _flat(config: dict) -> dict:
    inner = config.get("config") if isinstance(config.get("config"), dict) else {}
    return {**{k: v for k, v in config.items() if k != "config"}, **inner}


def group_runs(folders: list[Path], group_by: str = "config") -> dict[str, list[list[dict]]]:
    """label -> runs (lists of rows). group_by "config": one group per distinct config
    (seed ignored), labelled by algorithm, env and the fields that tell the groups apart;
    "none": one group per run folder."""
    if group_by not in ("config", "none"):
        raise ConfigError(f"--group-by must be config or none, got {group_by!r}")
    read = [(folder, *read_run(folder)) for folder in folders]
    if group_by == "none":
        return {_short(folder, folders): runs for folder, _, runs in read}
    keys, groups = {}, {}
    for folder, config, runs in read:
        key = json.dumps(config, sort_keys=True, default=str) if config is not None else str(folder)
        keys.setdefault(key, (folder, config))
        groups.setdefault(key, []).extend(runs)
    flats = {k: _flat(c) for k, (_, c) in keys.items() if c is not None}
    varying = sorted({f for a in flats.values() for f in a if len({json.dumps(b.get(f), default=str)
                                                                   for b in flats.values()}) > 1}
                     - {"algo", "env_id"})
    labels = {}
    for key, (folder, config) in keys.items():
        if config is None:
            label = _short(folder, folders)
        else:
            flat = flats[key]
            label = " ".join([str(flat.get("algo", "?")), str(flat.get("env_id", "?")),
                              *(f"{f}={flat.get(f)}" for f in varying)])
        labels[key] = label if label not in labels.values() else f"{label} ({_short(folder, folders)})"
    return {labels[k]: runs for k, runs in groups.items()}


def _short(folder: Path, folders: list[Path]) -> str:
    if len(folders) == 1:
        return folder.name
    import os

    common = Path(os.path.commonpath([f.resolve() for f in folders]))
    return str(folder.resolve().relative_to(common)) or folder.name


def plot_runs(paths, out: str | Path = "curves.png", y: str = "return_mean", group_by: str = "config",
              band: str = "minmax", title: str = "") -> dict[str, list[list[dict]]]:
    """Find the runs under `paths`, group them and write the figure to `out`; returns the groups."""
    if band not in ("minmax", "std"):
        raise ConfigError(f"--band must be minmax or std, got {band!r}")
    out = Path(out)
    if not out.resolve().parent.is_dir():
        raise ConfigError(f"--out {out}: folder {out.resolve().parent} does not exist")
    groups = group_runs(find_runs(paths), group_by)
    if not any(is_finite_number(r.get(y)) for runs in groups.values() for rows in runs for r in rows):
        columns = sorted({k for runs in groups.values() for rows in runs for r in rows for k in r})
        raise ConfigError(f"no finite {y!r} values in these runs; columns: {', '.join(columns)}")
    plot_curves(groups, out, title=title, y=y, band=band)
    return groups
