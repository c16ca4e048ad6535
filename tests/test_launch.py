"""fnrl launch: grid expansion, slot affinity, a queue of real runs, relaunch, Ctrl-C."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.launch import DONE, LAUNCH, expand, launch, load_grid, slot_resources

REPO = Path(__file__).resolve().parent.parent


def test_slot_resources_split_cores_evenly():
    assert slot_resources(2, cores=[0, 1, 2, 3, 4], gpus=0) == [([0, 1], None), ([2, 3], None)]
    assert slot_resources(4, cores=list(range(16)), gpus=2) == [
        (list(range(0, 4)), 0), (list(range(4, 8)), 1), (list(range(8, 12)), 0), (list(range(12, 16)), 1)]
    assert slot_resources(3, cores=[0, 1], gpus=0) == [([0], None), ([1], None), ([0], None)]
    with pytest.raises(ConfigError, match="slots"):
        slot_resources(0, cores=[0], gpus=0)


def test_expand_names_axes_and_validates(tmp_path):
    grid = dict(algo=["ppo", "a2c"], env_id="CartPole-v1", seed=[0, 1],
                overrides={"total_steps": 1000, "learning_rate": [1e-3, 3e-4], "hidden": (32, 32)},
                args=["--no-compile"], root=str(tmp_path))
    runs = expand(grid)
    with_kwargs = expand(dict(grid, overrides={"env_kwargs": {"max_episode_steps": 200}}))
    assert '--env-kwargs {"max_episode_steps": 200}' in " ".join(with_kwargs[0].argv)   # JSON, as the option takes
    assert len(runs) == 8
    assert runs[0].folder == tmp_path / "ppo-CartPole-v1-learning_rate0.001-s0"
    assert runs[0].argv[:7] == ["train", "ppo", "--seed", "0", "--log-dir", str(runs[0].folder), "--quiet"]
    assert "--hidden 32 32" in " ".join(runs[0].argv) and runs[0].argv[-1] == "--no-compile"
    # the same grid from YAML (tuples as lists of lists), where PyYAML is installed
    (tmp_path / "g.yaml").write_text(
        f"algo: [ppo, a2c]\nenv_id: CartPole-v1\nseed: [0, 1]\nargs: [--no-compile]\nroot: {tmp_path}\n"
        "overrides: {total_steps: 1000, learning_rate: [0.001, 0.0003], hidden: [[32, 32]]}\n")
    if importlib.util.find_spec("yaml") is not None:
        assert [r.argv for r in expand(load_grid(tmp_path / "g.yaml"))] == [r.argv for r in runs]
    for bad, message in [(dict(grid, overrides={"lr": 1}), "no Config field"), (dict(grid, algo="nope"),
                         "unknown algorithm"), (dict(grid, color=1), "unknown grid key"),
                         (dict(grid, overrides={"num_minibatches": 3}), "divide")]:
        with pytest.raises(ConfigError, match=message):
            expand(bad)


def _tiny_grid(tmp_path, total_steps=1024):
    path = tmp_path / "grid.py"
    path.write_text(f"GRID = dict(algo=['ppo', 'a2c'], env_id='CartPole-v1', seed=[0, 1], "
                    f"overrides={{'total_steps': {total_steps}, 'num_envs': 4, 'num_steps': 32}}, "
                    f"args=['--no-compile'], "
                    f"root={str(tmp_path / 'runs')!r})\n")
    return path


@pytest.mark.slow  # six child processes: about 40 s of CPU, mostly importing torch
def test_grid_runs_in_two_slots_and_relaunch_finishes_only_the_unfinished(tmp_path, capsys):
    grid = _tiny_grid(tmp_path)
    assert main(["launch", str(grid), "--slots", "2"]) == 0
    assert "4 done" in capsys.readouterr().out
    runs = expand(load_grid(grid))
    for run in runs:
        assert (run.folder / DONE).exists() and (run.folder / "checkpoint.pt").exists()
        assert json.loads((run.folder / LAUNCH).read_text())["cores"]
    stamps = {r.name: (r.folder / DONE).stat().st_mtime_ns for r in runs}
    # interrupted after its last checkpoint (resumed), and before its first one (restarted)
    (runs[1].folder / DONE).unlink()
    (runs[2].folder / DONE).unlink()
    (runs[2].folder / "checkpoint.pt").unlink()
    lines = []
    assert [o.action for o in launch(grid, slots=2, dry_run=True, echo=lines.append)] == [
        "skip", "resume", "start", "skip"]
    assert len(lines) == 4 and not (runs[2].folder / "checkpoint.pt").exists()
    outcomes = launch(grid, slots=2, echo=lambda s: None)
    assert [(o.action, o.status) for o in outcomes] == [("skip", "skipped"), ("resume", "done"),
                                                       ("start", "done"), ("skip", "skipped")]
    assert (runs[0].folder / DONE).stat().st_mtime_ns == stamps[runs[0].name]
    assert (runs[3].folder / DONE).stat().st_mtime_ns == stamps[runs[3].name]
    assert all((r.folder / DONE).exists() for r in runs)
    # a changed grid may not reuse the folders
    grid.write_text(grid.read_text().replace("'num_steps': 32", "'num_steps': 16"))
    with pytest.raises(ConfigError, match="other settings"):
        launch(grid, slots=2, echo=lambda s: None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_ctrl_c_stops_every_run(tmp_path):
    grid = _tiny_grid(tmp_path, total_steps=10**8)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen([sys.executable, "-m", "fnrl.cli", "launch", str(grid), "--slots", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                                start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 120
        launches = [tmp_path / "runs" / name / LAUNCH for name in ("ppo-CartPole-v1-s0", "ppo-CartPole-v1-s1")]
        while not all(p.exists() for p in launches) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        pids = [json.loads(p.read_text())["pid"] for p in launches]
        assert all(_alive(pid) for pid in pids)
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 130, out
        assert b"stopping 2 running run(s)" in out
        assert not any(_alive(pid) for pid in pids)
        assert not any((tmp_path / "runs" / n / DONE).exists() for n in ("ppo-CartPole-v1-s0", "ppo-CartPole-v1-s1"))
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=10)
        for pid in pids:
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
