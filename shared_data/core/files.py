"""Atomic file writes: a file either has its old content or its complete new one, never a part.

Every file the kit writes (run records, weights, converted volumes, predictions, figures) is written
to a temporary name in the same folder, flushed to disk and renamed over the target; ``os.replace``
is atomic on POSIX file systems, so a kill or a full disk leaves the previous file intact. Folders
(a SavedModel) are built beside their target and swapped in by :func:`atomic_dir`.
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


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on a clean exit, it replaces ``path``.

    A folder cannot be renamed over a non-empty one, so an existing ``path`` is first renamed aside
    and removed after the new one is in place: a reader sees the old folder or the complete new one
    (or, between the two renames, none). On an exception the temporary folder is removed and
    ``path`` is left as it was.
    """
    import shutil

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    old = path.with_name(f".{path.name}.old{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
