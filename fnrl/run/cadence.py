"""When a loop writes a log row and a checkpoint: every `log_interval` / `checkpoint_every` env
steps, the same rule in every loop.

    log, save = cadences(plan, stride, counters["env_steps"])
    if log.due(env_steps): log.passed(env_steps); ...write a row
    if save.due(env_steps): save.passed(env_steps); ...checkpoint
"""
from __future__ import annotations

from dataclasses import dataclass

ROWS_PER_RUN = 100
"""Log rows a run writes by default (one every total_steps / 100 env steps)."""

CHECKPOINTS_PER_RUN = 10
"""Checkpoints a run writes by default, the last at its end."""


@dataclass
class Cadence:
    """Marks at every multiple of `every` env steps, from the first after `start` (a resumed run's
    env steps, else 0): a resumed run logs at the steps the run would have logged at unstopped."""

    every: int
    start: int = 0

    def __post_init__(self):
        self.next = (self.start // self.every + 1) * self.every
        """the next mark: `due` once the run's env steps reach it"""

    def due(self, env_steps: int) -> bool:
        return env_steps >= self.next

    def passed(self, env_steps: int) -> None:
        """Move the next mark past `env_steps` (a long stride may pass several)."""
        while self.next <= env_steps:
            self.next += self.every


def cadences(plan, stride: int, env_steps: int) -> tuple[Cadence, Cadence]:
    """(log rows, checkpoints) of `plan` (`fnrl.run.plan.Plan`) from `env_steps` on, for a loop that
    advances `stride` env steps at a time: `plan.log_interval` (default about ROWS_PER_RUN rows a
    run) and `plan.checkpoint_every` (default CHECKPOINTS_PER_RUN), never less than one stride."""
    total = plan.config.total_steps
    log = Cadence(plan.log_interval or max(stride, total // ROWS_PER_RUN), env_steps)
    save = Cadence(plan.checkpoint_every or max(stride, total // CHECKPOINTS_PER_RUN), env_steps)
    return log, save
