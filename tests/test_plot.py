"""fnrl plot: runs found recursively, grouped by config (seed ignored), one png."""
import csv
import json

import pytest

from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.plot import find_runs, group_runs, plot_runs


def _fake_run(folder, seed, lr=1e-3, scale=1.0, seed_column=False):
    folder.mkdir(parents=True)
    config = {"algo": "ppo", "seed": seed, "config": {"env_id": "CartPole-v1", "learning_rate": lr}}
    (folder / "config.json").write_text(json.dumps(config))
    with open(folder / "progress.csv", "w", newline="") as f:
        fields = ["env_steps", "return_mean", "eval_return_mean"] + (["seed"] if seed_column else [])
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        for seeds in ([0, 1] if seed_column else [seed]):
            for step in range(100, 1100, 100):
                writer.writerow({"env_steps": step, "return_mean": scale * step / 10 + seeds,
                                 "eval_return_mean": step if step % 500 == 0 else float("nan"),
                                 **({"seed": seeds} if seed_column else {})})


def test_runs_differing_only_in_seed_form_one_group(tmp_path, capsys):
    _fake_run(tmp_path / "grid" / "ppo-s0", seed=0)
    _fake_run(tmp_path / "grid" / "ppo-s1", seed=1, scale=2.0)
    out = tmp_path / "curves.png"
    assert main(["plot", str(tmp_path / "grid"), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    assert "ppo CartPole-v1: 2 run(s)" in capsys.readouterr().out
    # a run folder and a parent folder together: found once each; another lr is another group
    _fake_run(tmp_path / "other" / "lr", seed=0, lr=3e-4)
    folders = find_runs([tmp_path / "grid" / "ppo-s0", tmp_path])
    assert len(folders) == 3
    groups = group_runs(folders)
    assert {label: len(runs) for label, runs in groups.items()} == {
        "ppo CartPole-v1 learning_rate=0.0003": 1, "ppo CartPole-v1 learning_rate=0.001": 2}
    assert len(group_runs(folders, "none")) == 3
    plot_runs([tmp_path], tmp_path / "eval.png", y="eval_return_mean", band="std")
    assert (tmp_path / "eval.png").exists()


def test_a_seed_column_splits_a_progress_csv_into_runs(tmp_path):
    _fake_run(tmp_path / "vmapped", seed=0, seed_column=True)
    (groups,) = [group_runs(find_runs([tmp_path]))]
    assert [len(runs) for runs in groups.values()] == [2]


def test_rows_repeated_by_a_resume_keep_the_latest(tmp_path):
    _fake_run(tmp_path / "r", seed=0)
    with open(tmp_path / "r" / "progress.csv", "a") as f:  # resumed from the checkpoint at 800
        f.write("900,-1,nan\n1000,-2,nan\n")
    (runs,) = group_runs(find_runs([tmp_path])).values()
    assert [r["env_steps"] for r in runs[0]] == list(range(100, 1100, 100))
    assert [r["return_mean"] for r in runs[0]][-2:] == [-1, -2]


def test_plot_errors(tmp_path):
    with pytest.raises(ConfigError, match="no progress.csv"):
        plot_runs([tmp_path])
    _fake_run(tmp_path / "r", seed=0)
    with pytest.raises(ConfigError, match="no finite 'loss'"):
        plot_runs([tmp_path], tmp_path / "x.png", y="loss")
    assert main(["plot", str(tmp_path / "missing")]) == 2
