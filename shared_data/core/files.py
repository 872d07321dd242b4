"""Atomic file writes: a file either has its old content or its complete new one, never a part.

Every file the kit writes (run records, weights, converted volumes, predictions, figures) is written
to a temporary name in the same folder, flushed to disk and renamed over the target; ``os.replace``
is atomic on POSIX file systems, so a kill or a full disk leaves the previous file intact. Folders
(a SavedModel) are built beside their target and swapped in by :func:`atomic_dir`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from shared_data.core.errors import EXIT_WITHOUT_FINALISERS


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


def first_missing_folder(path: str | Path) -> Path | None:
    """The outermost folder of ``path`` (itself or a parent) that does not exist yet, or None."""
    missing, path = None, Path(path).absolute()
    for folder in [path, *path.parents]:
        if folder.exists():
            return missing
        missing = folder
    return missing


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


@contextlib.contextmanager
def one_set_or_none(folder: str | Path, paths: list[Path]) -> Iterator[None]:
    """Around a command that writes the set of files (or folders) ``paths`` into ``folder`` (made
    where missing): if the body fails (a full disk), what it wrote is removed again, so no part of
    a new set stays: each of ``paths`` it created or replaced (its inode or modification time
    changed), the rest of ``paths`` too where it replaced an earlier file (the earlier set is broken
    and its record would describe files that are gone), and the folders it made."""
    import shutil

    made = first_missing_folder(folder)
    before = {p: _stamp(p) for p in paths}
    try:
        yield
    except BaseException:
        changed = [p for p in paths if _stamp(p) != before[p]]
        replaced = any(before[p] is not None for p in changed)
        for p in paths if replaced else changed:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists() or p.is_symlink():
                p.unlink(missing_ok=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise


def check_writable(path: str | Path, flag: str, folder: bool = False) -> None:
    """Check, before any work, that ``path`` can be written: a file (or with ``folder``, a folder made
    where missing) whose nearest existing ancestor is a folder where a file can be created. The
    check creates and removes a probe file, which holds for root too (root ignores permission bits,
    not a read-only mount or a parent that is a file).

    Raises:
        UserError: one line naming ``flag``, the path and what is in the way.
    """
    from shared_data.core.errors import UserError

    path = Path(path).absolute()
    if not folder and path.is_dir():
        raise UserError(f"{flag} {path} is a folder, expected a file path")
    if folder and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, expected a folder")
    if folder and path.is_symlink() and not path.exists():
        raise UserError(f"{flag} {path} is a symbolic link to {os.readlink(path)}, which does not exist")
    broken = _broken_link_above(path)
    if broken:
        raise UserError(f"{flag} {path}: {broken}")
    existing = path if folder and path.is_dir() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, expected a folder")
    probe = existing / f".write-probe.{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write in {existing} ({err.strerror})") from None


def _broken_link_above(path: Path) -> str | None:
    """What is wrong with a folder above ``path`` that is a symbolic link leading nowhere: a loop of
    links, or a link to a path that does not exist (either would end a later ``mkdir`` in an
    ``OSError``); None when there is none."""
    import errno

    for above in path.parents:
        if above.is_symlink() and not above.exists():
            try:
                os.stat(above)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return f"{above} is a loop of symbolic links (a link that leads back to itself)"
            return f"{above} is a symbolic link to {os.readlink(above)}, which does not exist"
    return None


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn a failed write inside the body (a full disk, a read-only file system, a quota:
    :func:`write_failure`) into one line naming ``path`` and the reason.

    Raises:
        UserError: ``cannot write <path> (<reason>)``.
    """
    from shared_data.core.errors import UserError

    try:
        with _quiet_h5py_finalisers():
            yield
    except Exception as err:  # h5py, TensorFlow and tensorstore wrap the OSError or quote it
        reason = write_failure(err)
        if reason is None:
            raise
        if "h5py" in sys.modules and sys.modules["h5py"].h5f.get_obj_ids(types=sys.modules["h5py"].h5f.OBJ_FILE):
            # HDF5 cannot close a file it cannot flush, and retries at the interpreter's exit, which
            # crashes: the command ends without the library's finalisers (errors.run_cli)
            EXIT_WITHOUT_FINALISERS.append(str(path))
        raise UserError(f"cannot write {path} ({reason})") from None


@contextlib.contextmanager
def _quiet_h5py_finalisers() -> Iterator[None]:
    """While the block runs, a write failure that an h5py object's finaliser meets (a flush in
    ``ObjectID.__dealloc__`` on a full disk: the failure :func:`writing` reports in its one line) is
    not printed: Cython prints it twice, through ``sys.excepthook`` and as "Exception ignored in"
    (``sys.unraisablehook``). Other errors reach both hooks as before."""
    previous_hook, previous_unraisable = sys.excepthook, sys.unraisablehook

    def excepthook(kind, value, tb) -> None:
        if not (_in_h5py(tb) and write_failure(value) is not None):
            previous_hook(kind, value, tb)

    def unraisablehook(unraisable) -> None:
        if not ("h5py" in repr(unraisable.object) and write_failure(unraisable.exc_value) is not None):
            previous_unraisable(unraisable)

    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook
    try:
        yield
    finally:
        sys.excepthook, sys.unraisablehook = previous_hook, previous_unraisable


def _in_h5py(tb) -> bool:
    """Whether the traceback ``tb`` ends in h5py's code (its Cython finalisers name ``h5py/``)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and "h5py" in tb.tb_frame.f_code.co_filename


def os_error_in(err: BaseException | None) -> OSError | None:
    """The ``OSError`` (a full disk, a vanished mount) that ``err`` is or wraps, else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def write_failure(err: BaseException) -> str | None:
    """The reason a write failed, if ``err`` is or wraps one: an ``OSError``'s text, the OS error
    code that tensorstore (orbax's writer) puts in its message (``[os_error_code='28']``), or the
    text of a full disk, a quota, a read-only file system, a denied or failed I/O that TensorFlow's
    ``OpError`` quotes; None for other errors."""
    import errno
    import re

    os_error = os_error_in(err)
    if os_error is not None and os_error.errno:  # h5py puts HDF5's whole multi-line report in strerror
        return os.strerror(os_error.errno)
    if os_error is not None and os_error.strerror:
        return os_error.strerror
    known = [os.strerror(e) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO, errno.EFBIG)]
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        code = re.search(r"os_error_code='(\d+)'", str(err))
        if code:
            return os.strerror(int(code[1]))
        text = next((t for t in known if t in str(err)), None)
        if text:
            return text
        err = err.__cause__ or err.__context__
    return None if os_error is None else " ".join(str(os_error).split())[:200]


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths ``a`` and ``b`` name one file or folder: the same path, a symbolic link to it
    (followed), or a hard link (the same device and inode, ``os.path.samefile``). A path that does
    not exist is compared by its resolved absolute form."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def _inside(path: str | Path, folder: str | Path) -> bool:
    """Whether ``path`` lies inside the existing folder ``folder`` (links resolved)."""
    if not os.path.isdir(folder):
        return False
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return top in real.parents


def _alias(a: str | Path, b: str | Path) -> str:
    """How two paths of one file are related: the same path, through a symbolic link, a hard link."""
    if os.path.abspath(os.path.expanduser(a)) == os.path.abspath(os.path.expanduser(b)):
        return "the same path"
    if os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b)):
        return "the same file through a symbolic link"
    return "a hard link of the same file"


def check_not_input(
    outputs: dict[str, str | Path | None], inputs: dict[str, str | Path | None], what: str = "output"
) -> None:
    """Check, before any work, that no output of a command is one of its inputs: the same path, a
    symbolic link to it or a hard link of it (:func:`same_file`), an input inside an output folder
    that the command replaces, or an output inside an input folder that it reads (a run's
    ``checkpoints``). Keys are what the user sees (``--out w.npz``, ``train_path``); ``None``
    values are skipped, and so are inputs that do not exist (their own check names them).

    Raises:
        UserError: ``<output key> <path> is <input key> <path> (...): write the <what> to another path``.
    """
    from shared_data.core.errors import UserError

    for out_key, out in outputs.items():
        if out is None:
            continue
        for in_key, inp in inputs.items():
            if inp is None or not os.path.lexists(inp):
                continue
            if same_file(out, inp):
                relation = f"is {in_key} {inp} ({_alias(out, inp)})"
            elif _inside(inp, out):
                relation = f"holds {in_key} {inp}"
            elif _inside(out, inp):
                relation = f"lies inside {in_key} {inp}"
            else:
                continue
            raise UserError(f"{out_key} {out} {relation}, which this command reads: write the {what} to another path")
