"""`--track wandb|mlflow`: the tracked run holds the same scalars as progress.csv, the config, and
continues on resume (W&B offline, an MLflow file store)."""
from __future__ import annotations

import csv
import json
import math

import pytest

from fnrl.presets import configure
from fnrl.run.tracking import STATE
from fnrl.train import train


def _progress(run) -> list[dict]:
    """The numeric columns of progress.csv (not `tier`, which trackers skip as they skip any text)."""
    return [{k: float(v) for k, v in row.items() if v not in ("", None) and k != "tier"}
            for row in csv.DictReader(open(run / "progress.csv"))]


def _expected(rows: list[dict], prefix=lambda row: "", sep="/") -> dict:
    """{(metric, env_steps): value} of every finite scalar of the progress rows, "/" in names as `sep`."""
    out = {}
    for row in rows:
        for k, v in row.items():
            if k not in ("env_steps", "seed") and math.isfinite(v):
                out[((prefix(row) + k).replace("/", sep), int(row["env_steps"]))] = v
    return out


def _train(run, track, total_steps=2048, plot=False, **options):
    config, _ = configure("ppo", "CartPole-v1", preset="none", total_steps=total_steps, num_envs=4, num_steps=64)
    train("ppo", config, seed=0, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=plot,
          log_interval=512, eval_interval=1024, eval_episodes=2, track=track, **options)


def test_mlflow_run_holds_the_progress_scalars_and_config_and_resumes(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    _train(run, "mlflow")
    run_id = json.loads((run / STATE).read_text())["run_id"]
    train("ppo", None, resume=run, changes={"total_steps": 3072}, compile=False, quiet=True, tensorboard=False,
          plot=False, log_interval=512, eval_interval=1024, eval_episodes=2, track="mlflow")
    assert json.loads((run / STATE).read_text())["run_id"] == run_id   # the same tracked run, continued
    client = MlflowClient()
    tracked = client.get_run(run_id)
    assert tracked.data.params["algo"] == "ppo" and tracked.data.params["num_envs"] == "4"
    got = {(k, m.step): m.value for k in tracked.data.metrics for m in client.get_metric_history(run_id, k)}
    expected = _expected(_progress(run), sep=".")
    assert max(step for _, step in expected) == 3072 and ("loss.policy", 3072) in expected
    assert got.keys() == expected.keys() and all(got[k] == pytest.approx(v) for k, v in expected.items())


def test_mlflow_names_a_vmapped_runs_scalars_by_seed_and_holds_curve_and_videos(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    _train(run, "mlflow", num_seeds=2, plot=True, capture_video=True)
    run_id = json.loads((run / STATE).read_text())["run_id"]
    client = MlflowClient()
    assert [a.path for a in client.list_artifacts(run_id)] == ["curve.png", "videos"]
    assert [a.path for a in client.list_artifacts(run_id, "videos")] == ["videos/eval-000001024.mp4",
                                                                          "videos/eval-000002048.mp4"]
    got = {(k, m.step): m.value for k in client.get_run(run_id).data.metrics
           for m in client.get_metric_history(run_id, k)}
    expected = _expected(_progress(run), prefix=lambda row: f"seed_{int(row['seed'])}/", sep=".")
    assert got.keys() == expected.keys() and all(got[k] == pytest.approx(v) for k, v in expected.items())


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B in offline mode, writing under tmp_path; its process-wide settings are torn down after."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()
    yield
    wandb.teardown()


def _wandb_records(folder):
    """The protobuf records of an offline W&B run's .wandb file (a LevelDB-format log after a
    7-byte header)."""
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()   # the service ends, and with it every write to the run's file
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, parts = path.read_bytes(), 7, []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:   # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        body, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        parts = [body] if kind in (1, 2) else parts + [body]
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def _wandb_history(folder) -> dict:
    """{(metric, step): value} of the history records of an offline W&B run."""
    out = {}
    for record in _wandb_records(folder):
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            step = items.pop("_step")
            out.update({(k, step): v for k, v in items.items() if not k.startswith("_")})
    return out


def _wandb_config(folder) -> dict:
    """The run's config as an offline W&B run recorded it (its run and config records)."""
    out = {}
    for record in _wandb_records(folder):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        out.update({i.key: json.loads(i.value_json) for i in items if not i.key.startswith("_")})
    return {k: v.get("value", v) if isinstance(v, dict) else v for k, v in out.items()}


def test_wandb_offline_run_holds_the_progress_scalars_and_config(tmp_path, offline_wandb):
    run = tmp_path / "run"
    _train(run, "wandb")
    got, expected = _wandb_history(tmp_path), _expected(_progress(run))
    assert ("loss/policy", 2048) in expected and ("eval_return_mean", 2048) in expected
    assert got.keys() == expected.keys() and all(got[k] == pytest.approx(v) for k, v in expected.items())
    config = _wandb_config(tmp_path)
    assert config["algo"] == "ppo" and config["seed"] == 0 and config["num_envs"] == 4 and config["num_steps"] == 64


def test_wandb_offline_run_holds_the_evaluation_videos_and_the_curve(tmp_path, offline_wandb):
    run = tmp_path / "run"
    _train(run, "wandb", capture_video=True, plot=True)
    history = _wandb_history(tmp_path)
    assert any(k == "curve/_type" and v == "image-file" for (k, _), v in history.items())
    videos: dict = {}   # the history's nested keys: videos/<name>/<field>
    for (k, _), v in history.items():
        if k.startswith("videos/"):
            name, _, field = k.rpartition("/")
            videos.setdefault(name, {})[field] = v
    assert sorted(videos) == ["videos/eval-000001024", "videos/eval-000002048"]
    assert all(v["_type"] == "video-file" and v["path"].endswith(".mp4") for v in videos.values())
    (media,) = tmp_path.glob("wandb/offline-run-*/files/media/videos")
    assert len(list(media.rglob("*.mp4"))) == 2
