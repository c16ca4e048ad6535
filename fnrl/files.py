"""Writing a file whole or not at all: a temporary file beside it, renamed over it when complete."""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def temporary_beside(path) -> Path:
    """A hidden name in `path`'s folder, unique to this process and call, with `path`'s suffix (so
    writers that pick a format by the extension keep it)."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp{path.suffix}")


@contextlib.contextmanager
def replacing(path):
    """Yields a temporary path to write; on success it replaces `path` (atomic on one filesystem),
    on an error it is removed and `path` is left as it was."""
    tmp = temporary_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
