"""Linux process and shared-memory probes for the tests that stop or kill real runs (/proc, /dev/shm)."""
from __future__ import annotations

import pathlib
import time

SHM = pathlib.Path("/dev/shm")


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's; [] once it is gone)."""
    out = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(k) for k in task.read_text().split()]
        except OSError:   # the thread ended meanwhile
            pass
    return out


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


def comm(pid: int) -> str:
    """The process's name (/proc/PID/comm)."""
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
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


def _inodes_in_use() -> set[int]:
    """The inodes of the /dev/shm files some live process maps or holds open (another test's
    semaphores, which multiprocessing keeps named while they live under "spawn" and "forkserver";
    a mapping names the file it was created as, so files are matched by inode)."""
    inodes = set()
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            inodes |= {int(line.split()[4]) for line in (proc / "maps").read_text().splitlines() if "/dev/shm/" in line}
            for fd in (proc / "fd").iterdir():
                if str(fd.readlink()).startswith("/dev/shm/"):
                    inodes.add(fd.stat().st_ino)
        except OSError:   # gone meanwhile, or not ours to read
            continue
    return inodes


def leaked_shared_memory(before: set[str], settle: float = 2.0) -> list[str]:
    """The /dev/shm entries created since `before` that are still there after `settle` seconds and
    that no live process uses: a leak (a segment in flight is unlinked within that time)."""
    new = shared_memory() - before
    if new:
        time.sleep(settle)
        new &= shared_memory()
        used = _inodes_in_use()
        new = {name for name in new if _inode(SHM / name) not in used}
    return sorted(new)


def _inode(path: pathlib.Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def run_ranks(fn, world: int, args: tuple, timeout: float = 240) -> None:
    """`fn(rank, *args)` in `world` spawned processes, one per rank; asserts every one exits 0
    within `timeout` seconds (one still running then is killed)."""
    import torch

    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(rank, *args), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0] * world
