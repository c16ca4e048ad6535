"""Run outputs: progress.csv, TensorBoard scalars and curve.png, one row per log interval."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from fnrl.files import replacing


class Logger:
    """Writes each row to `progress.csv` and TensorBoard; `plot()` draws `curve.png`.

    The CSV header is fixed by the first row; later rows may not add columns (missing
    ones are left empty). On resume (`resumed_at`: the checkpoint's env steps) the CSV is
    continued from the checkpoint: rows logged after it (a run stopped between checkpoints) are
    dropped, and TensorBoard hides its events after that step (`purge_step`), so no step is
    logged twice. `tracker` (`fnrl.run.tracking`) receives each row's scalars too, and is
    finished on `close()`. Videos of the run's evaluations (`RUN/videos/eval-<env steps>.mp4|gif`,
    `--capture-video`) go to TensorBoard as they appear, as small animated GIFs under
    `videos/eval` at their env steps (`fnrl.video.preview_gif`).
    """

    def __init__(self, log_dir: str | Path, tensorboard: bool = True, resumed_at: int | None = None, tracker=None):
        self.dir = Path(log_dir)
        self.tracker = tracker
        self.path = self.dir / "progress.csv"
        self.rows: list[dict] = []
        self._fields: list[str] | None = None
        resumed = resumed_at is not None
        if resumed and self.path.exists():
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self._fields = reader.fieldnames
                raw = list(reader)
            kept = [r for r in raw if not isinstance(csv_value(r.get("env_steps")), float)
                    or csv_value(r["env_steps"]) <= resumed_at]
            if len(kept) < len(raw):
                self._rewrite(kept)
            self.rows = [{k: csv_value(v) for k, v in r.items()} for r in kept]
        self._file = open(self.path, "a" if resumed else "w", newline="")
        self._writer = None if self._fields is None else csv.DictWriter(self._file, self._fields, extrasaction="ignore")
        self._tb = None
        self._videos_after = resumed_at if resumed else -1   # env steps of the last video sent to TensorBoard
        if resumed:   # the videos of evaluations after the checkpoint: the resumed run makes its own
            for path in self._videos(after=resumed_at).values():
                path.unlink(missing_ok=True)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir), purge_step=resumed_at + 1 if resumed else None)

    def _rewrite(self, rows: list[dict]) -> None:
        """progress.csv holding just `rows` (as read), replaced atomically."""
        with replacing(self.path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, self._fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    def log(self, row: dict) -> None:
        if self._writer is None:
            self._fields = list(row)
            self._writer = csv.DictWriter(self._file, self._fields, extrasaction="ignore")
            self._writer.writeheader()
        self._writer.writerow(row)
        self._file.flush()
        self.rows.append(row)
        # rows of a vmapped run (fnrl.seeds) carry a `seed` column: one tag prefix per row
        run_keys = ("seed", *self.group_keys) if "seed" in row else ()
        if self.tracker is not None:
            from fnrl.run.tracking import scalars

            self.tracker.log(scalars(row, run_keys), int(row["env_steps"]))
        if self._tb is not None:
            step = int(row["env_steps"])
            prefix = "".join(f"{k}={row[k]}/" for k in run_keys if k in row)
            for k, v in row.items():
                if k != "env_steps" and k not in run_keys and isinstance(v, (int, float)) \
                        and not (isinstance(v, float) and math.isnan(v)):
                    self._tb.add_scalar(prefix + k, v, step)
            self._send_videos()

    def _send_videos(self) -> None:
        """Each evaluation video written since the last call, to TensorBoard (an image summary of
        an animated GIF: what `SummaryWriter.add_video` writes, without its moviepy dependency)."""
        from fnrl.video import preview_gif

        new = self._videos(after=self._videos_after)
        for steps in sorted(new):
            from tensorboard.compat.proto.summary_pb2 import Summary

            self._videos_after = steps
            try:
                gif, height, width = preview_gif(new[steps])
            except Exception as e:   # noqa: BLE001 - a preview must not end the run; the video is in videos/
                import warnings

                warnings.warn(f"{new[steps]} was not sent to TensorBoard: {type(e).__name__}: {e}", stacklevel=3)
                continue
            image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
            self._tb._get_file_writer().add_summary(Summary(value=[Summary.Value(tag="videos/eval", image=image)]),
                                                    steps)

    def _videos(self, after: int) -> dict:
        """{env steps: path} of the evaluation videos (`videos/eval-<env steps>.mp4|gif`) after `after`."""
        found = {}
        for path in (self.dir / "videos").glob("eval-*.*"):
            steps = path.stem.removeprefix("eval-")
            if steps.isdigit() and int(steps) > after and path.suffix in (".mp4", ".gif"):
                found[int(steps)] = path
        return found

    group_keys: tuple = ()
    """columns that tell settings apart in a vmapped sweep (fnrl.seeds); set by the loop"""

    def plot(self, title: str = "") -> Path:
        """curve.png: the run's curve, or, for rows with a `seed` column (a vmapped run), the
        mean and min-max band over seeds, one band per value of `group_keys`."""
        if not self.rows or "seed" not in self.rows[0]:
            return plot_curves([self.rows], self.dir / "curve.png", title=title)
        groups: dict = {}
        for row in self.rows:
            label = ", ".join(f"{k}={row[k]:g}" for k in self.group_keys if k in row)
            groups.setdefault(label, {}).setdefault(row["seed"], []).append(row)
        return plot_curves({label or "return_mean": list(runs.values()) for label, runs in groups.items()},
                           self.dir / "curve.png", title=title)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self.tracker is not None:
            tracker, self.tracker = self.tracker, None
            try:   # the run's outputs are written; a tracker failing here must not hide why the run ended
                tracker.finish(self.dir)
            except Exception as e:   # noqa: BLE001
                import warnings

                warnings.warn(f"the tracker did not finish its run: {type(e).__name__}: {e}", stacklevel=2)


def interval_rows(shared: dict, episodes: list[dict], evaluations: list[dict] | None, metrics: list[dict],
                  labels: list[dict]) -> list[dict]:
    """The progress rows of one log interval, one per row of the run (a single run has one):
    the columns every row shares (`env_steps`, `updates`, `wall_s`, `sps`, ...), the row's
    labels (a vmapped run's `seed` and swept field), its episode statistics
    (`fnrl.episodes.EpisodeStats.columns`), its evaluation columns (None without evaluation)
    and its metrics, in that order: the column order of progress.csv."""
    evaluations = evaluations if evaluations is not None else [{}] * len(episodes)
    return [{**shared, **label, **episode, **evaluation, **metric}
            for label, episode, evaluation, metric in zip(labels, episodes, evaluations, metrics)]


def csv_value(v: str):
    """A progress.csv cell as a float where it reads as one, else the string."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def plot_curves(runs, path: str | Path, title: str = "", y: str = "return_mean", band: str = "minmax") -> Path:
    """Plot `y` against env_steps: one run as a line; many runs as their mean and a band.

    runs: a list of runs (each a list of row dicts), drawn as one curve, or a dict
        label -> list of runs, drawn as one curve per label (e.g. one per config, over seeds).
    band: "minmax" (min to max over runs) or "std" (mean +- one standard deviation). Many
        runs are interpolated onto 200 points of the env-step range they all cover.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = runs if isinstance(runs, dict) else {y: runs}
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, group in groups.items():
        curves = [([float(r["env_steps"]) for r in rows if is_finite_number(r.get(y))],
                   [float(r[y]) for r in rows if is_finite_number(r.get(y))]) for rows in group]
        curves = [c for c in curves if c[0]]
        if len(curves) == 1:
            ax.plot(*curves[0], label=label)
        elif curves:
            grid = np.linspace(max(c[0][0] for c in curves), min(c[0][-1] for c in curves), 200)
            ys = np.stack([np.interp(grid, *c) for c in curves])
            mean = ys.mean(0)
            low, high = (ys.min(0), ys.max(0)) if band == "minmax" else (mean - ys.std(0), mean + ys.std(0))
            line, = ax.plot(grid, mean, label=f"{label} (mean of {len(curves)})")
            ax.fill_between(grid, low, high, alpha=0.25, color=line.get_color())
    ax.set_xlabel("env steps")
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best" if isinstance(runs, dict) else "lower right", fontsize="small" if len(groups) > 3 else None)
    fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)


def is_finite_number(v) -> bool:
    """Whether a progress value is a finite int or float (not NaN, not a string)."""
    return isinstance(v, (int, float)) and math.isfinite(v)
