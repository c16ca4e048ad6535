"""fnrl.run.cadence: when every loop writes its log rows and checkpoints."""
from __future__ import annotations

import types

from fnrl.run.cadence import Cadence, cadences


def _marks(cadence: Cadence, stride: int, steps: int) -> list[int]:
    """The env steps at which a loop advancing `stride` at a time finds the cadence due."""
    hits = []
    for env_steps in range(cadence.start + stride, steps + 1, stride):
        if cadence.due(env_steps):
            cadence.passed(env_steps)
            hits.append(env_steps)
    return hits


def test_due_at_every_mark_a_stride_reaches_by_hand():
    assert _marks(Cadence(300), 100, 1000) == [300, 600, 900]
    assert _marks(Cadence(150), 100, 600) == [200, 300, 500, 600]     # 150, 300, 450, 600
    assert _marks(Cadence(50), 100, 300) == [100, 200, 300]           # a stride passes two marks


def test_a_resumed_run_keeps_the_marks_of_the_run_it_continues():
    cadence = Cadence(300, start=500)
    assert cadence.next == 600
    assert _marks(cadence, 100, 1500) == [600, 900, 1200, 1500]
    assert Cadence(300, start=600).next == 900


def test_defaults_are_a_hundred_rows_and_ten_checkpoints_never_below_one_stride():
    plan = types.SimpleNamespace(config=types.SimpleNamespace(total_steps=100_000), log_interval=None,
                                 checkpoint_every=None)
    log, save = cadences(plan, 256, 0)
    assert (log.every, save.every) == (1_000, 10_000)
    log, save = cadences(plan, 4_096, 0)
    assert (log.every, save.every) == (4_096, 10_000)
    plan.log_interval, plan.checkpoint_every = 500, 7_000
    log, save = cadences(plan, 256, 2_000)
    assert (log.every, log.next, save.every, save.next) == (500, 2_500, 7_000, 7_000)
