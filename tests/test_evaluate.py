"""Evaluation: the final evaluation of every run, online evaluation (eval_interval) and offline (Evaluator)."""
import csv
import dataclasses
import io
import math

import numpy as np
import pytest

from fnrl import algos
from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.evaluate import Evaluator, RunEvaluation
from fnrl.train import train
from fnrl.video import VideoWriter, preview_gif, read_frames

TINY = dict(total_steps=1024, num_envs=4, num_steps=32, update_epochs=1)


def _tiny_train(tmp_path, sub, **kwargs):
    config = dataclasses.replace(algos.default_config("ppo"), **TINY)
    return train("ppo", config, seed=3, log_dir=tmp_path / sub, quiet=True, compile=False, plot=False,
                 tensorboard=False, log_interval=128, **kwargs)


def test_online_eval_rows_and_training_stream_unchanged(tmp_path):
    """Eval rows (the first row at/after every 400 steps, and the last) hold finite
    eval_return_mean/std; other rows hold NaN; evaluating does not change training."""
    with_eval = _tiny_train(tmp_path, "eval", eval_interval=400, eval_episodes=3)
    rows = with_eval.history
    evaluated = [r["env_steps"] for r in rows if math.isfinite(r["eval_return_mean"])]
    assert evaluated == [512, 896, 1024]
    for r in rows:
        assert math.isfinite(r["eval_return_std"]) == math.isfinite(r["eval_return_mean"])
        if math.isfinite(r["eval_return_mean"]):
            assert r["eval_return_mean"] >= 8 and r["eval_return_std"] >= 0  # CartPole lasts >= 8 steps
    header = (tmp_path / "eval" / "progress.csv").read_text().splitlines()[0].split(",")
    assert "eval_return_mean" in header and "eval_return_std" in header

    plain = _tiny_train(tmp_path, "plain")
    assert [r["loss/policy"] for r in plain.history] == [r["loss/policy"] for r in rows]
    assert [r["return_mean"] for r in plain.history] == [r["return_mean"] for r in rows]


def test_evaluator_is_reusable_and_counts_episodes():
    config = algos.default_config("ppo")
    ev = Evaluator("ppo", config, episodes=5, num_envs=2)
    state = algos.load("ppo").make(config, ev.env.spec).init(0)
    try:
        first, second = ev(state), ev(state, episodes=3)
    finally:
        ev.close()
    assert len(first) == 5 and len(second) == 3
    assert all(r >= 8 and r == int(r) for r in first + second)


@pytest.mark.parametrize("interval, episodes, message", [(0, 10, "eval-interval"), (100, 0, "eval-episodes")])
def test_bad_eval_options_are_config_errors(interval, episodes, message):
    with pytest.raises(ConfigError, match=message):
        RunEvaluation("ppo", [algos.default_config("ppo")], [0], episodes, interval=interval)


def test_every_run_ends_with_a_final_evaluation_unless_turned_off(tmp_path):
    """By default only the last row is evaluated (10 episodes without exploration); eval_episodes=0 leaves
    the evaluation columns out."""
    result = _tiny_train(tmp_path, "final")
    evaluated = [r["env_steps"] for r in result.history if math.isfinite(r["eval_return_mean"])]
    assert evaluated == [1024]
    assert len(result.eval_returns) == 1 and len(result.eval_returns[0]) == 10
    assert result.eval_return_mean == pytest.approx(result.history[-1]["eval_return_mean"])
    off = _tiny_train(tmp_path, "off", eval_episodes=0)
    assert "eval_return_mean" not in off.history[-1] and off.eval_returns is None and math.isnan(off.eval_return_mean)


def test_vmapped_rows_are_each_evaluated_on_envs_of_their_own(tmp_path):
    """Each seed of a vmapped run gets its own final evaluation, on eval envs seeded from its seed: an
    evaluation of row 1's state alone, with seed 4's evaluation, gives the same returns."""
    config = dataclasses.replace(algos.default_config("ppo"), **TINY)
    result = train("ppo", config, seed=3, num_seeds=2, log_dir=tmp_path / "rows", quiet=True, compile=False,
                   plot=False, tensorboard=False, log_interval=128, eval_episodes=4)
    last = [r for r in result.history if r["env_steps"] == 1024]
    assert [r["seed"] for r in last] == [3, 4] and all(math.isfinite(r["eval_return_mean"]) for r in last)
    alone = RunEvaluation("ppo", [config], [4], 4)
    try:
        assert alone(result.state[1], 1024, final=True)[0]["eval_return_mean"] == last[1]["eval_return_mean"]
    finally:
        alone.close()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A 256-step PPO CartPole run made through the CLI with --eval-interval."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    argv = ["train", "ppo", "--log-dir", str(run), "--total-steps", "256", "--num-envs", "4", "--num-steps", "32",
            "--update-epochs", "1", "--no-compile", "--quiet", "--eval-interval", "256", "--eval-episodes", "2"]
    assert main(argv) == 0
    return run


def test_cli_eval_interval(tiny_run, tmp_path, capsys):
    rows = list(csv.DictReader(open(tiny_run / "progress.csv")))
    assert math.isfinite(float(rows[-1]["eval_return_mean"]))
    assert main(["train", "ppo", "--log-dir", str(tmp_path / "bad"), "--eval-interval", "-5"]) == 2
    assert "eval-interval" in capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".mp4", ".gif"])
def test_record_video_of_a_checkpoint(tiny_run, tmp_path, capsys, suffix):
    """`fnrl eval RUN --record-video` writes env 0's first episode: reset frame + one per step."""
    path = tmp_path / f"episode{suffix}"
    assert main(["eval", str(tiny_run), "--episodes", "2", "--record-video", str(path)]) == 0
    assert str(path) in capsys.readouterr().out
    if suffix == ".mp4":
        frames, (width, height), codec = mp4_facts(path)
        assert codec == "h264"
    else:
        from PIL import Image

        image = Image.open(path)   # Pillow merges identical consecutive frames, adding up their durations
        durations = []
        for k in range(image.n_frames):
            image.seek(k)
            durations.append(image.info["duration"])
        frames, (width, height) = round(sum(durations) / round(1000 / 30)), image.size
    assert frames >= 9 and (width, height) == (600, 400)  # a CartPole episode lasts >= 8 steps
    assert not list(tmp_path.glob("*.tmp*"))


def mp4_facts(path) -> tuple[int, tuple[int, int], str]:
    """(frames, (width, height), codec) of an mp4, as ffmpeg reads it."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    frames = sum(1 for _ in reader)
    return frames, tuple(meta["size"]), meta["codec"]


def test_record_video_errors(tiny_run, tmp_path, capsys):
    assert main(["eval", str(tiny_run), "--record-video", str(tmp_path / "x.avi")]) == 2
    assert main(["eval", str(tiny_run), "--record-video", str(tmp_path / "missing" / "x.mp4")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and ".mp4 or .gif" in err[0] and "does not exist" in err[1]
    config = dataclasses.replace(algos.default_config("ppo"), env_id="fnrltest/CountTerm-v0")
    with pytest.raises(ConfigError, match="cannot render"):
        Evaluator("ppo", config, episodes=1, record=[])


def test_video_writer_checks_frames(tmp_path):
    with pytest.raises(ConfigError, match="uint8"):
        VideoWriter(tmp_path / "a.gif").append(np.zeros((4, 4, 3), np.float32))
    video = VideoWriter(tmp_path / "b.gif")
    video.append(np.zeros((4, 6, 3), np.uint8))
    with pytest.raises(ConfigError, match="size changed"):
        video.append(np.zeros((6, 4, 3), np.uint8))


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_preview_gif_shrinks_a_video_by_a_stride_and_keeps_its_length(tmp_path, suffix):
    path = tmp_path / f"v{suffix}"
    with VideoWriter(path, fps=30) as video:
        for t in range(600):
            video.append(np.full((200, 330, 3), t % 256, np.uint8))
    assert sum(1 for _ in read_frames(path)) == 600
    gif, height, width = preview_gif(path, max_side=160, max_frames=250)
    from PIL import Image

    image = Image.open(io.BytesIO(gif))
    assert (height, width) == (image.height, image.width) == (67, 110)   # stride 3
    assert image.n_frames == 200 and image.info["duration"] == 100       # every 3rd frame, 3x as long


def test_capture_video_records_every_evaluation_as_h264(tmp_path, capsys):
    """`fnrl train --capture-video`: RUN/videos/eval-<env steps>.mp4 per evaluation, H.264, and in
    TensorBoard."""
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-steps", "1024", "--num-envs", "4", "--num-steps", "64", "--no-compile",
                 "--quiet", "--eval-interval", "512", "--eval-episodes", "2", "--capture-video",
                 "--log-dir", str(run)]) == 0
    videos = sorted((run / "videos").iterdir())
    assert [v.name for v in videos] == ["eval-000000512.mp4", "eval-000001024.mp4"]
    for video in videos:
        frames, size, codec = mp4_facts(video)
        assert codec == "h264" and size == (600, 400) and frames >= 9
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    events = EventAccumulator(str(run), size_guidance={IMAGES: 0}).Reload()
    previews = events.Images("videos/eval")   # the same episodes in TensorBoard, as animated GIFs
    assert [p.step for p in previews] == [512, 1024]
    assert all(p.encoded_image_string.startswith(b"GIF8") and (p.width, p.height) == (150, 100) for p in previews)
    assert main(["train", "ppo", "--eval-episodes", "0", "--capture-video", "--log-dir", str(tmp_path / "x")]) == 2
    assert "--capture-video records the evaluations' episodes" in capsys.readouterr().err



def test_capture_video_without_imageio_ffmpeg_records_gifs(tmp_path, monkeypatch):
    monkeypatch.setattr("fnrl.video.mp4_available", lambda: False)
    run = tmp_path / "run"
    assert main(["train", "ppo", "--total-steps", "512", "--num-envs", "4", "--num-steps", "64", "--no-compile",
                 "--quiet", "--eval-episodes", "1", "--capture-video", "--log-dir", str(run)]) == 0
    assert [v.name for v in (run / "videos").iterdir()] == ["eval-000000512.gif"]
    assert sum(1 for _ in read_frames(run / "videos" / "eval-000000512.gif")) >= 9
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, EventAccumulator

    events = EventAccumulator(str(run), size_guidance={IMAGES: 0}).Reload()
    assert [p.step for p in events.Images("videos/eval")] == [512]

def test_a_resumed_logger_drops_the_videos_of_evaluations_after_the_checkpoint(tmp_path):
    from fnrl.logger import Logger

    (tmp_path / "videos").mkdir()
    for steps in (512, 2048):
        with VideoWriter(tmp_path / "videos" / f"eval-{steps:09d}.gif") as video:
            video.append(np.zeros((8, 8, 3), np.uint8))
    Logger(tmp_path, tensorboard=False, resumed_at=1024).close()
    assert [v.name for v in (tmp_path / "videos").iterdir()] == ["eval-000000512.gif"]
