"""Evaluation: online during training (train(eval_interval=...)) and offline (Evaluator)."""
import math

import pytest
import torch

from fnrl import algos
from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.evaluate import Evaluator, OnlineEval
from fnrl.train import train

TINY = dict(total_steps=1024, num_envs=4, num_steps=32, update_epochs=1)


def _tiny_train(tmp_path, sub, **kwargs):
    import dataclasses

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


@pytest.mark.parametrize("interval, episodes, message", [(0, 10, "eval_interval"), (100, 0, "eval_episodes")])
def test_bad_eval_options_are_config_errors(interval, episodes, message):
    with pytest.raises(ConfigError, match=message):
        OnlineEval("ppo", algos.default_config("ppo"), interval, episodes)


def test_cli_eval_interval(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "ppo", "--log-dir", str(run), "--total-steps", "256", "--num-envs", "4", "--num-steps", "32",
            "--update-epochs", "1", "--no-compile", "--quiet", "--eval-interval", "256", "--eval-episodes", "2"]
    assert main(argv) == 0
    text = (run / "progress.csv").read_text().splitlines()
    assert "eval_return_mean" in text[0] and "nan" not in text[-1].split(",")[text[0].split(",").index(
        "eval_return_mean")]
    assert main(["train", "ppo", "--log-dir", str(tmp_path / "bad"), "--eval-interval", "-5"]) == 2
    assert "eval_interval" in capsys.readouterr().err
