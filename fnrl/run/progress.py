"""A run's progress: episode statistics, the rows of progress.csv / TensorBoard, the progress bar.

    progress = Progress(logger, "ppo CartPole-v1", total_steps, width, world=world, quiet=quiet)
    progress.add(rollout)                              # the episodes the rollout finished
    progress.advance(steps)                            # the progress bar
    progress.close_interval(counters)                  # every log interval: episodes of all ranks in
    progress.write(counters, evaluations, metric_rows) # one row per vmapped row
"""
from __future__ import annotations

import time

from fnrl.distributed.data_parallel import World
from fnrl.episodes import EpisodeStats, returns_by_row
from fnrl.logger import interval_rows
from fnrl.run.result import mean_of_rows


class Progress:
    """Episode statistics of `width` rows (`fnrl.episodes.EpisodeStats`: the trailing 100 episodes of
    each), the log rows written to `logger` (labelled with each row's `labels`), and a tqdm bar on the
    main process unless `quiet`. `counters` is the loop's dict of env_steps (per rank), updates,
    episodes and wall_s; episodes and wall_s are kept here."""

    def __init__(self, logger, desc: str, total_steps: int, width: int = 1, *,
                 world: World | None = None, quiet: bool = False, labels: list[dict] | None = None,
                 counters: dict | None = None, episodes: dict | None = None):
        self.logger, self.width = logger, width
        self.world = world or World()
        self.labels = labels or [{}] * width
        self.stats = EpisodeStats(width)
        if episodes is not None:
            self.stats.load_state_dict(episodes)
        self._finished = [[] for _ in range(width)]   # episodes each row finished since the last row
        start = (counters or {}).get("env_steps", 0)
        self._t_start = time.perf_counter() - (counters or {}).get("wall_s", 0.0)
        self._t_log, self._steps_log, self._sps = time.perf_counter(), start, 0.0
        self.interval_s = 0.0   # the length of the interval the last `close_interval` closed
        self.bar = None
        if not quiet and self.world.main:
            from tqdm import tqdm

            size = self.world.size
            self.bar = tqdm(total=total_steps * size, initial=start * size, unit="step", dynamic_ncols=True,
                            desc=desc)

    def add(self, rollout) -> None:
        """Note the episodes `rollout` ([T, width * B], with `done` and `episode_return`) finished."""
        for r, returns in enumerate(returns_by_row(rollout, self.width)):
            self._finished[r].extend(returns)

    def add_returns(self, returns: list[float], row: int = 0) -> None:
        """Note the returns of episodes row `row` finished."""
        self._finished[row].extend(returns)

    def advance(self, steps: int) -> None:
        """The bar, `steps` env steps on (of this rank; the bar counts all ranks)."""
        if self.bar is not None:
            self.bar.update(steps * self.world.size)

    def close_interval(self, counters: dict, stop_return: float | None = None) -> bool:
        """Take in the interval's episodes of every rank and update counters' episodes and wall_s;
        whether every row's trailing mean return reached `stop_return` (`EpisodeStats.reached`)."""
        self.stats.add([self.world.gather(returns) for returns in self._finished])
        self._finished = [[] for _ in range(self.width)]
        now = time.perf_counter()
        counters["episodes"] = sum(self.stats.finished)
        counters["wall_s"] = now - self._t_start
        steps = (counters["env_steps"] - self._steps_log) * self.world.size * self.width
        self.interval_s = max(now - self._t_log, 1e-9)
        self._sps = steps / self.interval_s
        self._t_log, self._steps_log = now, counters["env_steps"]
        return self.stats.reached(stop_return)

    def write(self, counters: dict, evaluations: list[dict] | None, metric_rows: list[dict],
              extra: dict | None = None, postfix: dict | None = None) -> list[dict]:
        """One progress.csv row per row of the run: the counters, the loop's `extra` columns, its
        episode statistics, its evaluation (None: no evaluation this interval) and its
        `metric_rows` entry; the bar shows sps, the mean return and `postfix`. Returns the rows."""
        shared = {"env_steps": counters["env_steps"] * self.world.size, "updates": counters["updates"],
                  "wall_s": round(counters["wall_s"], 3), "sps": round(self._sps, 1), **(extra or {})}
        rows = interval_rows(shared, self.stats.columns(), evaluations, metric_rows, self.labels)
        for row in rows:
            self.logger.log(row)
        if self.bar is not None:
            self.bar.set_postfix(sps=f"{self._sps:.0f}", ret=f"{mean_of_rows(self.stats.means()):.1f}",
                                 **(postfix or {}))
        return rows

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.logger.close()
