"""Atomic file writes: a file either has its old content or its complete new one, never a part.

Every file the kit writes (run records, weights, converted volumes, predictions, figures) is written
to a temporary name in the same folder, flushed to disk and renamed over the target; ``os.replace``
is atomic on POSIX file systems, so a kill or a full disk leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on a clean exit, move it over ``path``.

    ``suffix`` ends the temporary name (``".npz"`` for writers that insist on an extension). On an
    exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_file():
            tmp.unlink()
        raise


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
