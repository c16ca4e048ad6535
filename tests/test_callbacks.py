"""Callbacks (`fnrl.run.callbacks`): called at every log row, evaluation and checkpoint of every loop;
one returning True stops the run with its checkpoint; `best.pt` keeps the best evaluation's policy."""
from __future__ import annotations

import csv
import math

import pytest
import torch

from fnrl.errors import ConfigError
from fnrl.evaluate import evaluate_checkpoint
from fnrl.presets import configure
from fnrl.run.callbacks import BEST
from fnrl.run.checkpoint import CHECKPOINT, load_checkpoint
from fnrl.train import train


class Recorder:
    """Notes every call; asks to stop at the first log row at or past `stop_at` env steps."""

    def __init__(self, stop_at: int | None = None):
        self.stop_at, self.logs, self.evals, self.checkpoints = stop_at, [], [], []

    def on_log(self, event):
        assert torch.is_tensor(event.state["env_steps"]) and event.run_dir.is_dir()
        self.logs.append((event.env_steps, event.rows))
        return self.stop_at is not None and event.env_steps >= self.stop_at

    def on_eval(self, event):
        self.evals.append((event.env_steps, [r["eval_return_mean"] for r in event.rows]))

    def on_checkpoint(self, event, path):
        assert path.name == CHECKPOINT and path.exists()
        self.checkpoints.append(event.env_steps)


def _rows(run) -> list[dict]:
    return list(csv.DictReader(open(run / "progress.csv")))


def test_callbacks_see_every_row_evaluation_and_checkpoint_and_best_pt_keeps_the_best(tmp_path):
    config, _ = configure("ppo", "CartPole-v1", preset="none", total_steps=4096, num_envs=4, num_steps=32)
    recorder = Recorder()
    run = tmp_path / "run"
    train("ppo", config, seed=0, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False,
          log_interval=512, eval_interval=1024, eval_episodes=2, callbacks=[recorder])
    rows = _rows(run)
    assert [steps for steps, _ in recorder.logs] == [int(r["env_steps"]) for r in rows]
    assert [r["return_mean"] for _, (r,) in recorder.logs] == [pytest.approx(float(r["return_mean"]), nan_ok=True)
                                                                for r in rows]
    evaluated = [(int(r["env_steps"]), float(r["eval_return_mean"])) for r in rows
                 if math.isfinite(float(r["eval_return_mean"] or "nan"))]
    assert [(s, v[0]) for s, v in recorder.evals] == [(s, pytest.approx(v)) for s, v in evaluated]
    assert len(evaluated) >= 4 and recorder.checkpoints[-1] == 4096
    best = load_checkpoint(run / BEST, policy=True)
    assert best["eval_return_mean"] == pytest.approx(max(v for _, v in evaluated))
    assert best["env_steps"] == next(s for s, v in evaluated if v == pytest.approx(best["eval_return_mean"]))
    name, returns = evaluate_checkpoint(run / BEST, episodes=2)   # a policy file `fnrl eval` takes
    assert name == "ppo" and len(returns) == 2


@pytest.mark.parametrize("algo,options", [("ppo", {}), ("dqn", {"sampler": "async"}), ("impala", {})])
def test_a_callback_stops_every_loop_with_its_checkpoint(tmp_path, algo, options):
    config, _ = configure(algo, "CartPole-v1", preset="none", total_steps=20_000)
    recorder = Recorder(stop_at=2_000)
    run = tmp_path / "run"
    result = train(algo, config, seed=0, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False,
                   log_interval=1_000, eval_episodes=0, callbacks=[recorder], **options)
    stopped_at = recorder.logs[-1][0]
    assert 2_000 <= stopped_at < 20_000 and result.history[-1]["env_steps"] == stopped_at
    assert load_checkpoint(run)["counters"]["env_steps"] == stopped_at and recorder.checkpoints[-1] == stopped_at


class StopOnEval:
    """Early stopping on the evaluation: stops at the first evaluation at or past `steps`."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_eval(self, event):
        return event.env_steps >= self.steps


def test_an_evaluation_callback_stops_the_run_with_its_checkpoint(tmp_path):
    config, _ = configure("ppo", "CartPole-v1", preset="none", total_steps=8192, num_envs=4, num_steps=32)
    run = tmp_path / "run"
    result = train("ppo", config, seed=0, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False,
                   log_interval=512, eval_interval=1024, eval_episodes=2, callbacks=[StopOnEval(2048)])
    assert result.history[-1]["env_steps"] == 2048 and load_checkpoint(run)["counters"]["env_steps"] == 2048


def test_what_is_no_callback_or_cannot_take_callbacks_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="has none of the methods on_log, on_eval, on_checkpoint"):
        train("ppo", None, log_dir=tmp_path / "a", callbacks=[object()])
    with pytest.raises(ConfigError, match="callbacks run in single-process runs"):
        train("ppo", None, nproc=2, log_dir=tmp_path / "b", callbacks=[Recorder()])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
