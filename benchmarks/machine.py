"""What every benchmark table states about the machine it ran on."""
from __future__ import annotations

import platform
import statistics
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's best guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def prepend_report(path: Path, text: str) -> None:
    """Print `text` and write it on top of the earlier runs kept in `path`."""
    print(text)
    previous = path.read_text() if path.exists() else ""
    path.write_text(text + ("\n" + previous if previous else ""))


def in_turns(ours: list[float], theirs: list[float]) -> str:
    """Table cells for two contenders measured in alternating rounds (round r of each side by side):
    each side's median (range), then the medians' ratio with its range over the rounds."""
    def spread(xs):
        return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"

    ratios = [a / b for a, b in zip(ours, theirs)]
    return (f"{spread(ours)} | {spread(theirs)} | {statistics.median(ours) / statistics.median(theirs):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f})")
