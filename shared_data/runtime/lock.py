"""The run-folder lock: one trainer at a time in a run folder.

``<workdir>/run.lock`` holds an exclusive ``flock`` for as long as its trainer lives, and says who
holds it (host, pid, since when) so a second trainer refuses at once naming the holder. The kernel
drops the lock when its process dies, however it dies (kill -9 included), so a lock whose process
is gone never blocks: the file still names the dead holder and the next trainer takes it over with
a warning. ``flock`` works across hosts on the shared file systems a batch system mounts (NFSv4,
Lustre with ``flock`` mounted); two hosts on a file system without it each see the folder free.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import platform
import time
from pathlib import Path

from shared_data.core.errors import UserError

log = logging.getLogger("dlas")

LOCK_NAME = "run.lock"

#: Lock files this process holds (resolved path -> open file): a second run in the same process
#: (a test, a notebook) after one that ended in an error takes its own leftover over.
_HELD: dict[Path, object] = {}


def holder_text(holder: dict) -> str:
    """``host H, pid P, since S`` from a lock record (``unknown`` for a missing field)."""
    return ", ".join(f"{k} {holder.get(k, 'unknown')}" for k in ("host", "pid", "since"))


def _read(fh) -> dict:
    fh.seek(0)
    try:
        record = json.loads(fh.read() or "{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def acquire(workdir: Path) -> Path:
    """Lock ``workdir`` (which exists) for this process; return the lock file's path.

    Raises:
        UserError: another live process holds the folder (the message names its host, pid and start);
            the lock file cannot be written (a full disk).
    """
    path = (Path(workdir) / LOCK_NAME).absolute()
    release(path)
    try:
        fh = open(path, "a+")
    except OSError as err:
        raise UserError(f"cannot write the run folder {workdir}: {err.strerror} ({path})") from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = {}
        for _ in range(20):  # the holder writes its record right after it takes the lock
            holder = _read(fh)
            if holder:
                break
            time.sleep(0.05)
        fh.close()
        raise UserError(
            f"run folder {workdir} is in use by another trainer ({holder_text(holder)}); wait for it to "
            f"end, stop it, or use another --workdir"
        ) from None
    stale = _read(fh)
    if stale:
        log.warning("taking over the lock of %s from a trainer that is gone (%s)", workdir, holder_text(stale))
    record = {"host": platform.node(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:  # unbuffered: a full disk fails here, not at a later flush
        os.ftruncate(fh.fileno(), 0)
        os.write(fh.fileno(), json.dumps(record).encode())
    except OSError as err:
        fh.close()
        raise UserError(
            f"cannot write the run folder {workdir}: {err.strerror} ({path}); nothing in it is changed"
        ) from None
    _HELD[path] = fh
    return path


def release(path: Path) -> None:
    """Empty and unlock the lock file ``path`` if this process holds it (the file stays, so a trainer
    waiting on it never locks an unlinked file)."""
    fh = _HELD.pop(Path(path).absolute(), None)
    if fh is None:
        return
    try:
        fh.truncate(0)
    finally:
        fh.close()


@atexit.register
def release_all() -> None:
    """Release every lock this process holds: a trainer that ends in an error leaves no stale lock."""
    for path in list(_HELD):
        release(path)
