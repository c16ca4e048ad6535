"""`fnrl launch`: a grid of training runs as a queue on one machine (rlpyt's launcher, modern).

A grid file is a small Python file defining `GRID` (or a YAML file holding the same dict):

    GRID = dict(
        algo=["ppo", "a2c"],               # one name or a list
        env_id=["CartPole-v1"],            # one id or a list
        seed=[0, 1, 2],                    # one seed or a list
        overrides={"total_steps": 50_000,  # Config fields; a list is an axis of the grid
                   "learning_rate": [3e-4, 1e-3]},   # (give tuple-valued fields as tuples,
        args=["--no-compile"],             #  in YAML as a list of lists); extra `fnrl train` options
        root="runs/grid_cartpole",         # where the run folders go (relative to the working dir)
    )

Every combination algo x env_id x overrides-axes x seed is one run, trained by
`python -m fnrl.cli train ...` in a subprocess, in the folder
`root/ALGO-ENV[-FIELDVALUE...]-sSEED` (only override axes of 2+ values appear in the name). Up to
`slots` runs go at once; slot i is pinned to its share of the CPU cores (the cores this
process may use, split evenly, as rlpyt's affinity does) and, where GPUs exist, to GPU
i mod #GPUs through CUDA_VISIBLE_DEVICES (runs use it when `args` asks for `--device cuda`).

Each run folder gets `launch.json` (the command, cores, GPU and pid, written at start), `stdout.log` (the run's
output) and, once the run exits with code 0, a `done` marker. On relaunch a folder with
`done` is skipped, a folder with a checkpoint is continued with `--resume`, and any other
run starts afresh. A folder whose `launch.json` names another command is refused (the grid
changed under it). Ctrl-C (or SIGTERM) stops every run (SIGINT to each run's process
group, SIGKILL after a grace period); children also die with the launcher (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fnrl.errors import ConfigError

GRID_KEYS = {"algo", "env_id", "seed", "overrides", "args", "root"}
DONE = "done"
LAUNCH = "launch.json"
LOG = "stdout.log"
CHECKPOINT = "checkpoint.pt"


@dataclass
class Run:
    """One run of a grid: `argv` is the `fnrl` command line (without `--resume`)."""

    algo: str
    env_id: str
    seed: int
    overrides: dict
    folder: Path
    argv: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.folder.name

    def action(self) -> str:
        """What a launch does with this run now: "skip" (done), "resume" (checkpoint) or "start"."""
        if (self.folder / DONE).exists():
            return "skip"
        return "resume" if (self.folder / CHECKPOINT).exists() else "start"

    def command(self) -> list[str]:
        resume = ["--resume", str(self.folder)] if self.action() == "resume" else []
        return [sys.executable, "-m", "fnrl.cli", *self.argv, *resume]


@dataclass
class Outcome:
    """The launch's result for one run: action is skip / start / resume; status is
    skipped, done, failed (exit code `returncode`), interrupted or pending (dry run)."""

    run: Run
    action: str
    status: str
    returncode: int | None = None
    seconds: float = 0.0


def load_grid(path: str | Path) -> dict:
    """Read GRID from a Python file (`GRID = dict(...)`) or a YAML file (.yaml / .yml)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no grid file at {path}")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:
            raise ConfigError(f"{path}: reading YAML grids needs PyYAML; write the grid as a .py file") from e
        try:
            grid = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path} is not valid YAML{where} ({getattr(e, 'problem', None) or e}); fix the grid "
                              "file") from e
    elif path.suffix == ".py":
        import runpy

        try:
            grid = runpy.run_path(str(path)).get("GRID")
        except SyntaxError as e:
            raise ConfigError(f"{path} has a syntax error at line {e.lineno} ({e.msg}); fix the grid file") from e
        except Exception as e:   # the grid file's own code failed
            raise ConfigError(f"{path} failed to run ({type(e).__name__}: {e}); fix the grid file") from e
    else:
        raise ConfigError(f"{path}: a grid file is a .py file defining GRID or a .yaml file")
    if not isinstance(grid, dict):
        raise ConfigError(f"{path} does not define a GRID dict")
    return grid


def _axis(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def _slug(value) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
    return re.sub(r"[^A-Za-z0-9.,+=_-]", "_", text)


def _flags(name: str, value) -> list[str]:
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [option if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, (tuple, list)):
        return [option, *map(str, value)]
    if isinstance(value, dict):   # --env-kwargs
        return [option, json.dumps(value)]
    return [option, str(value)]


def expand(grid: dict) -> list[Run]:
    """All runs of `grid` (see the module docstring), validated before any starts: unknown
    keys, algorithms, Config fields and settings the algorithm refuses are ConfigErrors."""
    from fnrl import algos

    unknown = set(grid) - GRID_KEYS
    if unknown:
        raise ConfigError(f"unknown grid key(s) {', '.join(sorted(unknown))}; use {', '.join(sorted(GRID_KEYS))}")
    for key in ("algo", "env_id", "root"):
        if key not in grid:
            raise ConfigError(f"the grid needs {key!r}")
    overrides = grid.get("overrides") or {}
    args = [str(a) for a in grid.get("args") or []]
    if not isinstance(overrides, dict):
        raise ConfigError("grid 'overrides' must be a dict of Config fields")
    for reserved in ("env_id", "seed"):
        if reserved in overrides:
            raise ConfigError(f"give {reserved!r} as a grid key, not in overrides")
    axes = [k for k, v in overrides.items() if isinstance(v, list)]
    root = Path(grid["root"])
    runs = []
    for algo, env_id in itertools.product(_axis(grid["algo"]), _axis(grid["env_id"])):
        default = algos.default_config(algo)
        names = {f.name for f in dataclasses.fields(default)}
        bad = sorted(set(overrides) - names)
        if bad:
            raise ConfigError(f"{algo} has no Config field(s) {', '.join(bad)}")
        for values in itertools.product(*(_axis(overrides[k]) for k in axes)):
            setting = {**overrides, **dict(zip(axes, values)), "env_id": env_id}
            setting = {k: tuple(v) if isinstance(v, list) else v for k, v in setting.items()}
            algos.load(algo).validate(dataclasses.replace(default, **setting))
            tag = "".join(f"-{k}{_slug(v)}" for k, v in zip(axes, values) if len(overrides[k]) > 1)
            for seed in _axis(grid.get("seed", 0)):
                if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                    raise ConfigError(f"grid seeds are non-negative integers, got {seed!r}")
                folder = root / f"{algo}-{_slug(env_id)}{tag}-s{seed}"
                argv = ["train", algo, "--seed", str(seed), "--log-dir", str(folder), "--quiet"]
                for k, v in setting.items():
                    argv += _flags(k, v)
                runs.append(Run(algo, env_id, int(seed), setting, folder, argv + args))
    folders = [r.folder for r in runs]
    if len(set(folders)) != len(folders):
        raise ConfigError("two runs of the grid map to the same folder; make the grid's values distinct")
    return runs


def slot_resources(slots: int, cores: list[int] | None = None, gpus: int | None = None) -> list[tuple]:
    """(cores, gpu) of each slot: the cores split evenly among the slots (rlpyt's affinity;
    with more slots than cores, slots share cores round-robin), gpu = slot mod #GPUs or None."""
    if slots < 1:
        raise ConfigError(f"--slots must be at least 1, got {slots}")
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    per = max(1, len(cores) // slots)
    out = []
    for i in range(slots):
        mine = cores[i * per:(i + 1) * per] if len(cores) >= slots else [cores[i % len(cores)]]
        out.append((mine, i % gpus if gpus else None))
    return out


def _child_setup(cores: list[int]):
    def setup():
        os.sched_setaffinity(0, cores)
        try:  # die with the launcher, even if it is SIGKILLed
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass
    return setup


def _child_env(gpu) -> dict:
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parent.parent)  # the same fnrl in the child
    env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [env.get("PYTHONPATH")])])
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def _check_same_command(run: Run) -> None:
    path = run.folder / LAUNCH
    if path.exists():
        try:
            recorded = json.loads(path.read_text()).get("argv")
        except (ValueError, AttributeError) as e:
            raise ConfigError(f"{path} is corrupt ({type(e).__name__}); delete it to start that run again, or move "
                              "the folder away") from e
        if recorded != run.argv:
            raise ConfigError(f"{run.folder} holds a run launched with other settings; "
                              f"move it away or change the grid's root")


def _stop(procs, grace: float) -> None:
    """SIGINT each child's process group, then SIGKILL whatever is left after `grace` s."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def launch(grid: dict | str | Path, slots: int = 1, dry_run: bool = False, poll: float = 0.2,
           grace: float = 10.0, echo=print) -> list[Outcome]:
    """Run the grid as a queue with `slots` concurrent runs; returns one Outcome per run.

    Finished runs are skipped, interrupted ones resumed (see the module docstring).
    `echo` receives one status line per event. On KeyboardInterrupt (or SIGTERM) every
    running child is stopped and the interrupt is re-raised.
    """
    if not isinstance(grid, dict):
        grid = load_grid(grid)
    runs = expand(grid)
    resources = slot_resources(slots)
    for run in runs:
        _check_same_command(run)
    outcomes = {id(r): Outcome(r, r.action(), "pending") for r in runs}
    queue = [r for r in runs if outcomes[id(r)].action != "skip"]
    for run in runs:
        if outcomes[id(run)].action == "skip":
            outcomes[id(run)].status = "skipped"
            echo(f"[skip]   {run.name} (done)")
    if dry_run:
        for i, run in enumerate(queue):
            cores, gpu = resources[i % slots]
            echo(f"[{outcomes[id(run)].action}]  {run.name}: cores {cores}"
                 + (f", gpu {gpu}" if gpu is not None else "") + f": fnrl {' '.join(run.command()[3:])}")
        return [outcomes[id(r)] for r in runs]
    if queue:
        Path(grid["root"]).mkdir(parents=True, exist_ok=True)
    running: dict[int, tuple] = {}  # slot -> (run, proc, start time)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    # Ctrl-C stops the grid even where this process inherited SIGINT ignored or blocked
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        while queue or running:
            for slot in range(slots):
                if slot not in running and queue:
                    run = queue.pop(0)
                    cores, gpu = resources[slot]
                    run.folder.mkdir(parents=True, exist_ok=True)
                    command = run.command()
                    with open(run.folder / LOG, "ab") as log:
                        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=_child_env(gpu),
                                                preexec_fn=_child_setup(cores), start_new_session=True)
                    (run.folder / LAUNCH).write_text(json.dumps({"argv": run.argv, "command": command,
                                                                 "cores": cores, "gpu": gpu, "pid": proc.pid},
                                                                indent=2))
                    running[slot] = (run, proc, time.monotonic())
                    echo(f"[{outcomes[id(run)].action}]  {run.name} on slot {slot} (cores {cores}"
                         + (f", gpu {gpu}" if gpu is not None else "") + f"); {len(queue)} queued")
            for slot, (run, proc, start) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[slot]
                outcome = outcomes[id(run)]
                outcome.returncode, outcome.seconds = code, time.monotonic() - start
                if code == 0:
                    (run.folder / DONE).write_text(json.dumps({"finished": time.time()}))
                    outcome.status = "done"
                    echo(f"[done]   {run.name} in {outcome.seconds:.0f} s")
                else:
                    outcome.status = "failed"
                    echo(f"[failed] {run.name}: exit code {code}; see {run.folder / LOG}")
            time.sleep(poll)
    except KeyboardInterrupt:
        for run, _, _ in running.values():
            outcomes[id(run)].status = "interrupted"
        echo(f"[stop]   stopping {len(running)} running run(s); relaunch to resume them")
        _stop([proc for _, proc, _ in running.values()], grace)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    return [outcomes[id(r)] for r in runs]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def summary(outcomes: list[Outcome]) -> str:
    counts = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())
