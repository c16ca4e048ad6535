"""Callbacks: a user's code at a run's log rows, evaluations and checkpoints, in every loop.

    class StopAtLoss:
        def on_log(self, event):                    # every log row (all rows of a vmapped run)
            return event.rows[-1]["loss/value"] < 1e-3   # True: stop after this row's checkpoint

    result = train("ppo", config, callbacks=[StopAtLoss()], eval_interval=10_000)

A callback is any object with some of these methods (each optional):

    on_log(event: Event) -> bool | None          at every log row, after progress.csv has it
    on_eval(event: Event) -> bool | None         at a log row with an evaluation (`eval_return_mean`)
    on_checkpoint(event: Event, path) -> None    after the checkpoint `path` was written

`Event` has the algorithm's `name`, its `config`, the run folder `run_dir`, `env_steps` (of the
whole run), the progress rows just written (`rows`: one per vmapped row, with the columns of
progress.csv) and the training `state` (a TensorDict: read it, do not change it). An `on_log` or
`on_eval` returning True stops the run at that row: the checkpoint is written and `train`
returns. The row's evaluation, if it has one, is then the run's last (`on_eval` stops right
after an evaluation; `--stop-return`, decided before the row's evaluation, always gets a final
one). Callbacks run in the training process, between iterations; they see a
single-process run (`--nproc` and torchrun runs refuse them).

`KeepBest` is the callback behind `best.pt`: every run that evaluates while it trains
(`eval_interval`) keeps the policy of its best evaluation there (`fnrl eval RUN/best.pt`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from fnrl.errors import ConfigError

BEST = "best.pt"
"""The policy file of a run's best evaluation, in its folder."""

_HOOKS = ("on_log", "on_eval", "on_checkpoint")


@dataclasses.dataclass
class Event:
    """What a callback sees (module docstring)."""

    name: str
    config: Any
    run_dir: Path | None
    env_steps: int
    rows: list[dict]
    state: Any


class KeepBest:
    """Writes the policy file (`fnrl.run.checkpoint.policy_payload`) of the run's state to
    `run_dir / best.pt` at each evaluation whose return (`eval_return_mean`, averaged over a vmapped
    run's rows) beats every earlier one; the file also holds that `eval_return_mean` and `env_steps`.
    A resumed run (`resumed`) starts from the best of its `best.pt`; a new one replaces any."""

    def __init__(self, act_keys, resumed: bool = False):
        self.act_keys, self.best, self.resumed = act_keys, None, resumed

    def on_eval(self, event: Event) -> None:
        from fnrl.run.checkpoint import load_checkpoint, policy_payload, save_checkpoint

        path = event.run_dir / BEST
        if self.best is None and self.resumed and path.exists():
            self.best = load_checkpoint(path, policy=True).get("eval_return_mean", -math.inf)
        score = sum(r["eval_return_mean"] for r in event.rows) / len(event.rows)
        if math.isfinite(score) and (self.best is None or score > self.best):
            self.best = score
            payload = policy_payload(event.name, dataclasses.asdict(event.config), event.state, self.act_keys)
            save_checkpoint(path, {**payload, "eval_return_mean": score, "env_steps": event.env_steps})


class Callbacks:
    """The run's callbacks, called by its loop (`logged` after each progress row, `checkpointed`
    after each checkpoint); empty on every process but the main one."""

    def __init__(self, callbacks, name: str, config, run_dir: Path | None):
        self.callbacks, self.name, self.config, self.run_dir = list(callbacks), name, config, run_dir

    def logged(self, env_steps: int, rows: list[dict], state) -> bool:
        """Call on_log (and on_eval where the rows hold an evaluation); whether one asked to stop."""
        if not self.callbacks:
            return False
        event = Event(self.name, self.config, self.run_dir, env_steps, rows, state)
        evaluated = any(math.isfinite(r.get("eval_return_mean", math.nan)) for r in rows)
        stop = False
        for callback in self.callbacks:
            stop |= bool(_call(callback, "on_log", event))
            if evaluated:
                stop |= bool(_call(callback, "on_eval", event))
        return stop

    def checkpointed(self, env_steps: int, path: Path, state) -> None:
        if self.callbacks:
            event = Event(self.name, self.config, self.run_dir, env_steps, [], state)
            for callback in self.callbacks:
                _call(callback, "on_checkpoint", event, path)


def _call(callback, hook: str, *args):
    method = getattr(callback, hook, None)
    return method(*args) if method is not None else None


def check_callbacks(callbacks, world_size: int) -> list:
    """The callbacks as a list: ConfigError for one with none of the hooks, or for a run of several
    processes."""
    callbacks = list(callbacks or [])
    for callback in callbacks:
        if not any(callable(getattr(callback, hook, None)) for hook in _HOOKS):
            raise ConfigError(f"callback {callback!r} has none of the methods {', '.join(_HOOKS)}")
    if callbacks and world_size > 1:
        raise ConfigError("callbacks run in single-process runs; drop --nproc (or torchrun) or the callbacks")
    return callbacks


def for_run(plan, run_dir: Path | None, main: bool = True) -> Callbacks:
    """The callbacks of `plan` (`fnrl.run.plan.Plan`) on the main process, `KeepBest` first where
    the run evaluates while it trains; none elsewhere."""
    if not main:
        return Callbacks([], plan.name, plan.run_config, run_dir)
    keep_best = ([KeepBest(plan.module.SPEC.act_keys, resumed=plan.ckpt is not None)]
                 if plan.eval_interval and plan.eval_episodes else [])
    return Callbacks(keep_best + list(plan.callbacks), plan.name, plan.run_config, run_dir)
