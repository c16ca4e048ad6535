"""Episode statistics of a training run: the trailing mean return and the stop rule.

A run's `return_mean` is the mean return of the last `window` (100) episodes that finished,
for each row of the run (one row for a single run; one per seed / swept value of a vmapped
run), as stable-baselines3's episode buffer reports it. Unlike the mean over the few
episodes that happen to end within one log interval, it does not jump with the 2-4 episodes
of an interval, and it is defined in every interval once an episode has finished (a policy
that balances CartPole for 500 steps ends few episodes per interval).

    stats = EpisodeStats(rows=2)
    stats.add([[10.0, 12.0], [30.0]])       # the episodes each row finished in a collect
    stats.columns()                          # per row: return_mean, return_interval, episodes
    stats.reached(475.0)                     # the stop rule of `--stop-return`
"""
from __future__ import annotations

import math
from collections import deque

WINDOW = 100
"""Finished episodes in the trailing mean (stable-baselines3's `stats_window_size`)."""
MIN_EPISODES = 20
"""Finished episodes a row needs before `--stop-return` may stop it."""


class EpisodeStats:
    """The finished episodes of each of `rows` rows of a run.

    add(by_row): record the returns of the episodes each row finished (a list per row).
    columns(): one dict per row for the log row, and a new interval begins:
        `return_mean`: mean return of the row's last `window` finished episodes (NaN only
            before its first episode ends);
        `return_interval`: mean return of the episodes that ended since the last log row
            (NaN if none did);
        `episodes`: how many ended since the last log row.
    reached(target): whether every row has finished at least `min_episodes` episodes and its
        trailing mean is at least `target`.
    state_dict() / load_state_dict(): the windows and counts as plain lists, for checkpoints.
    """

    def __init__(self, rows: int = 1, window: int = WINDOW, min_episodes: int = MIN_EPISODES):
        if rows < 1 or window < 1:
            raise ValueError(f"need rows >= 1 and window >= 1, got {rows} and {window}")
        self.window, self.min_episodes = window, min_episodes
        self._recent = [deque(maxlen=window) for _ in range(rows)]
        self._finished = [0] * rows
        self._interval: list[list[float]] = [[] for _ in range(rows)]

    @property
    def rows(self) -> int:
        return len(self._recent)

    def add(self, by_row: list[list[float]]) -> None:
        if len(by_row) != self.rows:
            raise ValueError(f"returns for {len(by_row)} rows given to statistics of {self.rows}")
        for r, returns in enumerate(by_row):
            if returns:
                self._recent[r].extend(returns)
                self._interval[r].extend(returns)
                self._finished[r] += len(returns)

    @property
    def finished(self) -> list[int]:
        """Episodes each row has finished since the run began."""
        return list(self._finished)

    def means(self) -> list[float]:
        """The trailing mean return of each row (NaN for a row without a finished episode)."""
        return [_mean(recent) for recent in self._recent]

    def columns(self) -> list[dict]:
        out = [{"return_mean": _mean(recent), "return_interval": _mean(interval), "episodes": len(interval)}
               for recent, interval in zip(self._recent, self._interval)]
        self._interval = [[] for _ in range(self.rows)]
        return out

    def reached(self, target: float | None) -> bool:
        """The stop rule: every row has finished `min_episodes` episodes and its trailing mean
        return is at least `target` (never for target None)."""
        if target is None:
            return False
        return all(n >= self.min_episodes and m >= target for n, m in zip(self._finished, self.means()))

    def state_dict(self) -> dict:
        return {"recent": [list(r) for r in self._recent], "finished": list(self._finished)}

    def load_state_dict(self, saved: dict) -> None:
        if len(saved["recent"]) != self.rows:
            raise ValueError(f"statistics of {len(saved['recent'])} rows loaded into {self.rows}")
        for recent, values in zip(self._recent, saved["recent"]):
            recent.clear()
            recent.extend(float(v) for v in values)
        self._finished = [int(n) for n in saved["finished"]]


def returns_by_row(rollout, num_rows: int = 1) -> list[list[float]]:
    """The returns of the episodes that ended in `rollout` [T, R * B] (keys `episode_end`,
    `episode_return`), grouped by row: row r holds env columns r * B .. (r + 1) * B - 1."""
    ended = rollout["episode_end"]
    out = [[] for _ in range(num_rows)]
    if not ended.any():
        return out
    T = ended.shape[0]
    ended = ended.reshape(T, num_rows, -1)
    returns = rollout["episode_return"].reshape(T, num_rows, -1)[ended].tolist()
    for r, g in zip(ended.nonzero()[:, 1].tolist(), returns):
        out[r].append(g)
    return out


def _mean(values) -> float:
    return math.fsum(values) / len(values) if values else math.nan
