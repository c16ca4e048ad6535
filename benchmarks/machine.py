"""What every benchmark table states about the machine it ran on."""
from __future__ import annotations

import platform
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
