"""The learning matrix behind `fnrl bench --learning`: does every algorithm learn, on every seed?

Each cell is an (algorithm, env) pair trained the way a user would run it, with the env's preset
(`fnrl/presets`) at rl-baselines3-zoo's budget:

    fnrl train ALGO --env ENV --total-steps BUDGET --num-seeds 8 --seed 0

(8 separate runs, two at a time, for an algorithm that cannot be vmapped). Each seed is judged on
the final evaluation of its policy without exploration (10 episodes on separate envs, in
progress.csv as `eval_return_mean`). Per cell: the interquartile mean (IQM) over the seeds with
a 95% percentile-bootstrap interval (Agarwal et al. 2021, "Deep RL at the edge of the
statistical precipice"), the worst seed, how many seeds reach the cell's threshold, rl-zoo3's
published figure (`benchmark.md` of rl-baselines3-zoo: one run per cell) and the cell's goal,
IQM >= zoo mean - zoo std, and the wall time beside that of 8 single runs two at a time
(measured on one pair of single runs, times 4).

    fnrl bench --learning [--only dqn/CartPole-v1,ppo/Acrobot-v1] [--seed 0] [--no-singles]
    python benchmarks/learning.py --render      # the table and figure from the saved results

Results go to `results/learning.json` (merged: a run of some cells keeps the others), the
table to `learning.md` and the figure (a panel per env: each algorithm's IQM curve of the
trailing training return with its bootstrap band, the zoo figure as a dashed line) to
`learning.png`, all with the machine and date.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "learning.json"
TABLE = HERE / "learning.md"
FIGURE = HERE / "learning.png"
SEEDS = 8


@dataclass(frozen=True)
class Cell:
    """One cell: an algorithm on an env, rl-zoo3's published mean and std there, and its budget."""

    algo: str
    env: str
    zoo_mean: float | None
    zoo_std: float | None
    budget: int
    threshold: float

    @property
    def key(self) -> str:
        return f"{self.algo}/{self.env}"

    @property
    def goal(self) -> float:
        """The IQM the cell must reach: rl-zoo3's mean minus its std (CartPole: 500 - 0)."""
        return self.zoo_mean - self.zoo_std if self.zoo_mean is not None else self.threshold


def _cells() -> list[Cell]:
    cart = [("ppo", 500, 0, 100_000), ("a2c", 500, 0, 500_000), ("dqn", 500, 0, 50_000), ("qrdqn", 500, 0, 50_000),
            ("c51", None, None, 100_000), ("rainbow", None, None, 100_000), ("iqn", None, None, 100_000),
            ("r2d1", None, None, 150_000), ("impala", None, None, 300_000)]
    out = [Cell(a, "CartPole-v1", m, s, b, 475.0) for a, m, s, b in cart]
    for algo, env, mean, std, budget in [
            ("dqn", "Acrobot-v1", -76.639, 11.752, 100_000), ("qrdqn", "Acrobot-v1", -69.135, 9.967, 100_000),
            ("a2c", "Acrobot-v1", -83.353, 17.213, 500_000), ("ppo", "Acrobot-v1", -73.506, 18.201, 1_000_000),
            ("sac", "Pendulum-v1", -156.995, 88.714, 20_000), ("td3", "Pendulum-v1", -151.855, 90.227, 20_000),
            ("ddpg", "Pendulum-v1", -152.099, 94.282, 20_000), ("ppo", "Pendulum-v1", -172.225, 104.159, 100_000),
            ("sac", "MountainCarContinuous-v0", 94.679, 1.134, 50_000),
            ("dqn", "LunarLander-v2", 154.382, 79.241, 100_000), ("a2c", "LunarLander-v2", 155.751, 80.419, 200_000),
            ("ppo", "LunarLander-v2", 242.119, 31.823, 1_000_000)]:
        out.append(Cell(algo, env, mean, std, budget, mean - std))
    return out


CELLS = _cells()
BY_KEY = {c.key: c for c in CELLS}
VMAPPED = {"ppo", "a2c", "dqn", "qrdqn", "c51", "rainbow", "iqn", "r2d1", "ddpg", "td3", "sac"}
"""Algorithms that train their 8 seeds in one vmapped process (`--num-seeds`)."""


# ---------------------------------------------------------------------------- statistics

def iqm(values) -> float:
    """The interquartile mean: the mean of the middle half of the sorted values (with 8 values,
    the 3rd to the 6th), as rliable computes it (scipy's trim_mean with 25% cut at each end)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(math.floor(0.25 * len(x)))
    return float(x[cut:len(x) - cut].mean())


def bootstrap_interval(values, statistic=iqm, resamples: int = 10_000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of `statistic` over `values` (resampled with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    g = np.random.default_rng(seed)
    draws = x[g.integers(0, len(x), size=(resamples, len(x)))]
    stats = np.sort(draws, axis=1)
    cut = int(math.floor(0.25 * len(x)))
    boot = stats[:, cut:len(x) - cut].mean(1) if statistic is iqm else np.apply_along_axis(statistic, 1, draws)
    alpha = (1 - level) / 2
    return float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))


# ---------------------------------------------------------------------------- running cells

def _command(cell: Cell, seed: int, num_seeds: int, log_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "fnrl", "train", cell.algo, "--env", cell.env, "--total-steps", str(cell.budget),
           "--seed", str(seed), "--log-dir", str(log_dir), "--quiet", "--compile"]   # no builder outlives a run
    return cmd + (["--num-seeds", str(num_seeds)] if num_seeds > 1 else [])


def _run_together(commands: list[list[str]], logs: list[Path], timeout: float) -> float:
    """Run the commands at once; their wall time (RuntimeError naming a failed one)."""
    start = time.perf_counter()
    procs = []
    for cmd, log in zip(commands, logs):
        log.parent.mkdir(parents=True, exist_ok=True)
        procs.append((subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT), cmd, log))
    for proc, cmd, log in procs:
        try:
            code = proc.wait(timeout=max(timeout - (time.perf_counter() - start), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeError(f"{' '.join(cmd[3:6])} ran over {timeout:.0f} s") from None
        if code != 0:
            tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed with exit code {code}: {tail[0]}")
    return time.perf_counter() - start


def _read_runs(run_dirs: list[Path]) -> dict[int, dict]:
    """seed -> {"curve": [(env_steps, return_mean)], "eval": final eval_return_mean} of the runs."""
    out = {}
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        with open(run_dir / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            seed = int(row.get("seed") or config["seed"])
            entry = out.setdefault(seed, {"curve": [], "eval": None})
            ret = float(row["return_mean"])
            if math.isfinite(ret):
                entry["curve"].append((int(float(row["env_steps"])), ret))
            ev = float(row.get("eval_return_mean") or "nan")
            if math.isfinite(ev):
                entry["eval"] = ev
    return out


def run_cell(cell: Cell, seed: int, work: Path, singles: bool, timeout: float) -> dict:
    """Train the cell's 8 seeds (and, with `singles`, a pair of single runs); its results."""
    seeds = list(range(seed, seed + SEEDS))
    if cell.algo in VMAPPED:
        run_dirs = [work / "vmapped"]
        wall = _run_together([_command(cell, seed, SEEDS, run_dirs[0])], [work / "vmapped.log"], timeout)
    else:   # 8 single runs, two at a time
        run_dirs, wall = [], 0.0
        for s in seeds[::2]:
            pair = [work / f"seed{s}", work / f"seed{s + 1}"]
            wall += _run_together([_command(cell, t, 1, d) for t, d in zip((s, s + 1), pair)],
                                  [d.with_suffix(".log") for d in pair], timeout)
            run_dirs += pair
    singles_wall = None
    if singles and cell.algo in VMAPPED:
        pair = [work / "single0", work / "single1"]
        singles_wall = 4 * _run_together([_command(cell, s, 1, d) for s, d in zip(seeds[:2], pair)],
                                         [d.with_suffix(".log") for d in pair], timeout)
    runs = _read_runs(run_dirs)
    missing = [s for s in seeds if runs.get(s, {}).get("eval") is None]
    if missing:
        raise RuntimeError(f"{cell.key}: no final evaluation for seed(s) {missing}")
    evals = [runs[s]["eval"] for s in seeds]
    low, high = bootstrap_interval(evals)
    value = iqm(evals)
    return {**asdict(cell), "goal": cell.goal, "seeds": seeds, "evals": evals, "iqm": value, "ci": [low, high],
            "worst": min(evals), "reached": sum(e >= cell.threshold for e in evals),
            "meets_goal": value >= cell.goal, "wall_s": wall, "singles_wall_s": singles_wall,
            "date": str(date.today()), "machine": machine(),
            "curves": {str(s): runs[s]["curve"] for s in seeds}}


# ---------------------------------------------------------------------------- reporting

def machine() -> str:
    sys.path.insert(0, str(HERE))
    from machine import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores, no GPU used"


def _num(x: float) -> str:
    return f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def render(results: dict) -> str:
    cells = [results["cells"][c.key] for c in CELLS if c.key in results["cells"]]
    lines = [
        "# Learning matrix", "",
        "Every cell: `fnrl train ALGO --env ENV --total-steps BUDGET --num-seeds 8 --seed 0` with the env's preset "
        "(8 separate runs, two at a time, where the algorithm cannot be vmapped), judged on each seed's final "
        "evaluation without exploration (10 episodes on separate envs). IQM: interquartile mean over the 8 seeds, "
        "with its 95% bootstrap interval. Goal: rl-zoo3's mean minus its std (`benchmark.md` of "
        "rl-baselines3-zoo, one run per cell); CartPole cells also need 7 of 8 seeds at 475. Singles: 8 single "
        "runs two at a time, from one pair measured in the same sitting, times 4.", "",
        f"Machine: {results['machine']}. Written by `fnrl bench --learning` ({results['date']}); regenerate "
        "with `fnrl bench --learning`.", "",
        "| algo | env | budget | IQM [95% CI] | worst | >= threshold | zoo (std) | goal | met | wall | singles |",
        "|---|---|---:|---|---:|---:|---|---:|:---:|---:|---:|",
    ]
    for r in cells:
        zoo = f"{_num(r['zoo_mean'])} ({_num(r['zoo_std'])})" if r["zoo_mean"] is not None else "-"
        singles = f"{r['singles_wall_s']:.0f} s" if r.get("singles_wall_s") else "-"
        met = r["meets_goal"] and (r["env"] != "CartPole-v1" or r["reached"] >= 7)
        lines.append(f"| {r['algo']} | {r['env']} | {r['budget'] // 1000}k | {_num(r['iqm'])} "
                     f"[{_num(r['ci'][0])}, {_num(r['ci'][1])}] | {_num(r['worst'])} | {r['reached']}/8 "
                     f"(>= {_num(r['threshold'])}) | {zoo} | {_num(r['goal'])} | {'yes' if met else '**no**'} | "
                     f"{r['wall_s']:.0f} s | {singles} |")
    notes = results.get("notes", {})
    if notes:
        lines += ["", "## Notes", ""] + [f"- **{k}**: {v}" for k, v in notes.items()]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = []
    for c in CELLS:
        if c.key in results["cells"] and c.env not in envs:
            envs.append(c.env)
    if not envs:
        return
    fig, axes = plt.subplots(1, len(envs), figsize=(4.2 * len(envs), 3.6), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for c in CELLS:
            r = results["cells"].get(c.key)
            if r is None or c.env != env:
                continue
            curves = [np.asarray(v, dtype=np.float64) for v in r["curves"].values() if len(v) > 1]
            if not curves:
                continue
            grid = np.linspace(max(x[0, 0] for x in curves), min(x[-1, 0] for x in curves), 100)
            ys = np.stack([np.interp(grid, x[:, 0], x[:, 1]) for x in curves], axis=1)   # [points, seeds]
            mid = np.array([iqm(y) for y in ys])
            band = np.array([bootstrap_interval(y, resamples=1000) for y in ys])
            line, = ax.plot(grid, mid, label=c.algo)
            ax.fill_between(grid, band[:, 0], band[:, 1], alpha=0.2, color=line.get_color())
            if c.zoo_mean is not None:
                ax.axhline(c.zoo_mean, ls="--", lw=0.8, color=line.get_color())
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel("return (last 100 episodes), IQM of 8 seeds")
    fig.suptitle(f"fnrl learning matrix; dashed: rl-zoo3 ({results['machine']}, {results['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def load_results() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"cells": {}, "notes": {}}


def save(results: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    TABLE.write_text(render(results))
    plot(results, FIGURE)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fnrl bench --learning", description="Train the learning matrix: every "
                                "cell's 8 seeds, judged on their final evaluation.")
    p.add_argument("--only", default=None, help=f"comma-separated cells (ALGO/ENV): {', '.join(BY_KEY)}")
    p.add_argument("--seed", type=int, default=0, help="the first of the 8 seeds (default: 0)")
    p.add_argument("--no-singles", action="store_true", help="skip the pair of single runs timed beside each cell")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds one command may run (default: 7200)")
    p.add_argument("--render", action="store_true", help="only rewrite the table and figure from the results")
    args = p.parse_args(argv)
    keys = args.only.split(",") if args.only else list(BY_KEY)
    unknown = [k for k in keys if k not in BY_KEY]
    if unknown:
        raise ValueError(f"unknown cell(s) {', '.join(unknown)}; choose from {', '.join(BY_KEY)}")
    results = load_results()
    if args.render:   # the results' own machine and date: nothing was measured here
        save(results)
        return 0
    results.update(machine=machine(), date=str(date.today()))
    failed = []
    for key in keys:
        cell = BY_KEY[key]
        with tempfile.TemporaryDirectory(prefix="fnrl-learning-") as work:
            try:
                r = run_cell(cell, args.seed, Path(work), not args.no_singles, args.timeout)
            except RuntimeError as e:
                print(f"{key}: {e}", file=sys.stderr)
                failed.append(key)
                continue
        results["cells"][key] = r
        save(results)
        print(f"{key}: IQM {r['iqm']:.1f} [{r['ci'][0]:.1f}, {r['ci'][1]:.1f}], worst {r['worst']:.1f}, "
              f"{r['reached']}/8 >= {cell.threshold:g}, goal {cell.goal:.1f} {'met' if r['meets_goal'] else 'MISSED'}, "
              f"{r['wall_s']:.0f} s" + (f" (singles {r['singles_wall_s']:.0f} s)" if r["singles_wall_s"] else ""),
              flush=True)
    print(f"table: {TABLE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
