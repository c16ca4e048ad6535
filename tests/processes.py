"""Linux process and shared-memory probes for the tests that stop or kill real runs (/proc, /dev/shm)."""
from __future__ import annotations

import pathlib
import time

SHM = pathlib.Path("/dev/shm")


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's)."""
    return [int(k) for task in pathlib.Path(f"/proc/{pid}/task").glob("*/children") for k in task.read_text().split()]


def descendants(pid: int) -> list[int]:
    """Every process under `pid`."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        return "zombie" not in pathlib.Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except FileNotFoundError:
        return ""


def wait_gone(pids, timeout: float = 60.0) -> list[str]:
    """Wait up to `timeout` s for `pids` to end; the command lines of those still running."""
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [cmdline(p) for p in pids if alive(p)]


def shared_memory() -> set[str]:
    """The names in /dev/shm (POSIX shared memory and named semaphores)."""
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def leaked_shared_memory(before: set[str], settle: float = 2.0) -> list[str]:
    """The /dev/shm entries created since `before` that are still there after `settle` seconds
    (another test's segment in flight is unlinked within that time; a leaked one stays)."""
    new = shared_memory() - before
    if new:
        time.sleep(settle)
        new &= shared_memory()
    return sorted(new)
