"""User-facing errors and the one place that turns them into a one-line message and exit code 2.

Every error a user can cause (a bad config key, a missing file, a malformed dataset) is raised as a
subclass of :class:`UserError` whose message names the file, key or value and what was expected.
Command-line entry points wrap their ``main`` with :func:`run_cli`, so such errors never end in a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import resource  # imported at start: under a tight ulimit -v its library may not load later
import sys
from collections.abc import Callable, Iterator, Sequence


class UserError(Exception):
    """An error caused by the user's input; the message is complete and printed as is."""


class ConfigError(UserError):
    """A config file, config name, key, value or command-line override is invalid."""


class DatasetError(UserError):
    """A dataset file is missing or breaks the dataset contract (keys, shapes, dtypes, values)."""


class MissingDependencyError(UserError):
    """An optional dependency (DALI, TensorFlow, ...) is not installed; the message names the extra."""


def say(line: str) -> None:
    """Write ``line`` and its newline to stderr in one write and flush it. ``print`` writes the text
    and the newline apart (two system calls on an unbuffered stderr), so where processes share one
    stderr (those of a multi-process run, their launcher) another process's line can land between
    them, gluing two lines into one."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def quoted(value, limit: int = 80) -> str:
    """``repr(value)`` for an error message, bounded: nested containers and long strings are
    abbreviated as they are walked (``reprlib``), so a value of gigabytes (a YAML anchor bomb)
    is never expanded, and the text is cut at ``limit`` characters."""
    import reprlib

    short = reprlib.Repr(maxlevel=4, maxlist=12, maxtuple=12, maxdict=8, maxset=8, maxstring=limit, maxlong=40)
    short.maxother = limit
    try:
        text = short.repr(value)
    except RecursionError:
        text = f"<a {type(value).__name__} nested too deep to show>"
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def bounded(text: str, limit: int = 400) -> str:
    """``text`` (a library's message that quotes user input) cut in the middle to at most about
    ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}... ({len(text) - 2 * half} characters left out) ...{text[-half:]}"


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'X'?)`` for the candidate closest to a mistyped ``word`` (``difflib``'s
    similarity ratio at least 0.6), else an empty string; for flag and config-key typos."""
    import difflib

    if len(word) > 100:  # no key is that long: nothing is close, and difflib would take its time
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_WRAPPED = re.compile(r"(?:UserError|ConfigError|DatasetError|MissingDependencyError): (.+)")


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err``, then the exception it was raised from or during (``__cause__``, else ``__context__``),
    and so on, each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def user_error_in(err: BaseException) -> str | None:
    """The message of a :class:`UserError` that ``err`` is or wraps: raised inside a DALI callback
    (the chain's ``__cause__``) or a ``tf.data`` Python function (only its text survives)."""
    for exc in _chain(err):
        if isinstance(exc, UserError):
            return str(exc)
        match = _WRAPPED.search(str(exc))
        if match:
            return match.group(1).strip()
    return None


def require_package(module: str, extra: str, package: str) -> None:
    """Check that ``module`` (the framework of ``package``) is installed, or stop with one line naming
    the extra.

    Under ``python -m package.command`` (``sys.argv[0] == "-m"`` while the package imports) a
    missing framework prints ``error: ...`` and exits with code 2; imported from other code it raises
    :class:`MissingDependencyError`.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        message = f"{package} needs {module}, which is not installed: pip install 'dlas-cosmo[{extra}]'"
        if sys.argv[:1] == ["-m"]:
            say(f"error: {message}")
            raise SystemExit(2)
        raise MissingDependencyError(message)


def name_too_long(err: OSError) -> str | None:
    """The one line for a path the user gave that is longer than the file system allows
    (``ENAMETOOLONG``, wherever the path is first used); None for other errors."""
    import errno
    import os

    if err.errno != errno.ENAMETOOLONG:
        return None
    path = str(err.filename)
    try:
        limits = f"{os.pathconf('/', 'PC_NAME_MAX')} characters a name, {os.pathconf('/', 'PC_PATH_MAX')} a path"
    except (OSError, ValueError):
        limits = "see the file system's limits"
    return f"{path[:60]}...{path[-20:]} ({len(path)} characters): a name longer than the file system allows ({limits})"


def symlink_loop(err: OSError) -> str | None:
    """The one line for a path the user gave that runs through a loop of symbolic links (``ELOOP``,
    wherever the path is first used); None for other errors."""
    import errno

    if err.errno != errno.ELOOP:
        return None
    where = "a path" if err.filename is None else bounded(str(err.filename), 200)
    return f"{where}: too many levels of symbolic links (a link that leads back to itself); expected a real path"


def write_error_line(err: OSError) -> str | None:
    """The one line for a write that failed where no command turned it into its own line (a full
    disk, a quota, a read-only file system, a file-size limit, an I/O error inside a library's
    writer): the file where the error names it, else the kit's frame that wrote (:func:`_kit_frame`).
    None for other errors."""
    import errno
    import os

    if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO):
        return None
    reason = os.strerror(err.errno)
    if err.filename is not None:
        return f"cannot write {err.filename} ({reason})"
    return f"a write failed ({reason}){_kit_frame(err)}; what the command reported before stands"


def address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` of this process (``ulimit -v``) in bytes, or None when there is none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


#: glibc's ``mallopt`` parameter of the number of malloc arenas (``M_ARENA_MAX`` in ``malloc.h``).
M_ARENA_MAX = -8
_arenas: dict = {"tried": False, "capped": False}


def cap_malloc_arenas() -> bool:
    """Under a ``ulimit -v``, cap glibc's malloc arenas at 2 (``mallopt(M_ARENA_MAX)``, what the
    variable ``MALLOC_ARENA_MAX`` sets at start): every thread that allocates would otherwise reserve
    an arena of 64 MiB of address space, unused but counted against the limit; a framework's thread
    pools and compiler, and a first orbax save, start enough threads to exhaust it so. Tried once
    (where a limit is set); returns whether the arenas are capped (False where glibc is not the C
    library or no limit is set)."""
    if not _arenas["tried"] and address_space_limit() is not None:
        _arenas["tried"] = True
        import ctypes

        try:
            _arenas["capped"] = ctypes.CDLL(None).mallopt(M_ARENA_MAX, 2) == 1
        except (OSError, AttributeError):
            pass
    return _arenas["capped"]


def _kit_frame(err: BaseException) -> str:
    """`` at <file>:<line> (<function>)``: the innermost frame of ``err``'s traceback in the kit's own
    code, where a failed allocation was asked for; empty when none is."""
    from pathlib import Path

    root, where = Path(__file__).resolve().parents[2], ""
    tb = err.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.is_relative_to(root) and ".venv" not in path.parts:
            where = f" at {path.relative_to(root)}:{tb.tb_lineno} ({tb.tb_frame.f_code.co_name})"
        tb = tb.tb_next
    return where


def out_of_memory(err: BaseException, where: str | None = None) -> str | None:
    """The one line for memory that could not be allocated, naming what and where: a ``MemoryError``
    (NumPy's text names the array), a thread that could not start (its stack and malloc arena are
    address space too), an ``ENOMEM`` from the system (``mmap`` of shared memory), a library that
    could not be mapped at import; with the process's ``ulimit -v`` where one is set. ``where``
    (default: the kit's frame that asked, :func:`_kit_frame`) follows what. None for other errors."""
    import errno

    text = str(err)
    if isinstance(err, MemoryError):
        what = text or "an allocation failed (MemoryError)"
    elif isinstance(err, RuntimeError) and text.startswith("can't start new thread"):
        what = "a thread could not start (no memory for its stack)"
    elif isinstance(err, OSError) and err.errno == errno.ENOMEM:
        what = f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    elif isinstance(err, ImportError) and "failed to map segment from shared object" in text:
        library = text.split(":")[0].strip()
        what = f"{library} could not be loaded (failed to map segment from shared object)"
    else:
        return None
    if where is None:
        where = "" if isinstance(err, ImportError) else _kit_frame(err)  # the library names what could not be mapped
    limit = address_space_limit()
    if limit is None:
        return f"out of memory: {what}{where}; the host has no more to give"
    return f"out of memory: {what}{where}; this process may map {limit / 2**20:.0f} MiB (ulimit -v)"


def out_of_memory_in(err: BaseException) -> str | None:
    """:func:`out_of_memory`'s line for ``err`` or the first exception in its chain (``__cause__``,
    ``__context__``) that is memory: a library that wraps a thread that could not start or a
    ``MemoryError`` in an error of its own (TensorStore's "error while reading array"). None when no
    exception in the chain is."""
    return next((message for exc in _chain(err) if (message := out_of_memory(exc)) is not None), None)


def import_framework(module: str, importer: Callable[[str], object] | None = None):
    """Import the framework ``module`` (with ``importer``, default ``importlib.import_module``) and
    return it. A framework that cannot load for want of memory (``ulimit -v``: its libraries cannot
    be mapped, or its Python objects allocated) is :func:`out_of_memory`'s one line: under ``python
    -m package.command`` printed with exit code 2, as :func:`require_package` does, else raised as a
    :class:`UserError`. Under a ``ulimit -v`` the malloc arenas are capped first
    (:func:`cap_malloc_arenas`)."""
    import importlib

    cap_malloc_arenas()  # before the framework's thread pools start
    try:
        return (importer or importlib.import_module)(module)
    except (ImportError, MemoryError) as err:
        message = out_of_memory(err, f" while {module} imports")
        if message is None:
            raise
        if sys.argv[:1] == ["-m"]:
            say(f"error: {message}")
            raise SystemExit(2) from None
        raise UserError(message) from None


#: Files that a native library (HDF5) holds open after a failed write (:mod:`shared_data.core.files`
#: adds them); while it is not empty, :func:`run_cli` ends the process with ``os._exit`` after flushing
#: its output.
EXIT_WITHOUT_FINALISERS: list[str] = []
#: Checkpoint folders whose failed save left TensorStore's writes calling back into orbax's closed event
#: loop (:mod:`jax_impl.checkpoints` adds them): once the interpreter finalises, its hooks that drop
#: those reports are gone and each prints a traceback after the run's line, so while it is not empty
#: :func:`run_cli` ends the process after the ``atexit`` functions (the loader's workers end there),
#: without the interpreter's finalisation.
EXIT_AFTER_ATEXIT: list[str] = []
#: The exit code :func:`run_cli` ends the process with after the ``atexit`` functions (None until then):
#: an ``atexit`` function reads it through :func:`ending_code`.
_ending: list[int] = []


def ending_code() -> int | None:
    """The exit code the process ends with when :func:`run_cli` runs the ``atexit`` functions itself (an
    error, a signal), else None (a normal end, or still running)."""
    return _ending[-1] if _ending else None


def _exit_if_native_files_are_stuck(code: int) -> None:
    """End the process now with ``code`` when a native library holds a file it failed to write
    (:data:`EXIT_WITHOUT_FINALISERS`): its finalisers would retry the write at exit and crash after
    the error line. Output and log files are flushed first."""
    if EXIT_WITHOUT_FINALISERS and "pytest" not in sys.modules:  # a test's process goes on
        _exit_now(code)


def _exit_before_device_work_ends(code: int) -> None:
    """End the process now with ``code`` when a framework is loaded: the command's own ``finally``
    blocks have run, and the interpreter's finalisation would wait for the device work already
    dispatched (a step of a GPU-sized config on a CPU: minutes after the ``interrupted`` line). The
    ``atexit`` functions run first (multiprocessing ends the loader's workers there, logging flushes
    its files); a test's process goes on."""
    if {"jax", "tensorflow"} & sys.modules.keys():
        exit_after_atexit(code)


def exit_after_atexit(code: int) -> None:
    """End the process with ``code`` after the ``atexit`` functions, without the interpreter's
    finalisation; a test's process goes on."""
    if "pytest" not in sys.modules:
        import atexit

        _ending.append(code)
        atexit._run_exitfuncs()
        _exit_now(code)


def _exit_now(code: int) -> None:
    """Flush the log files, stdout and stderr, then end the process with ``code`` without finalisers."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _error_exit(code: int) -> int:
    """``code``, for a command that ends in its error line; the process ends here with it where a native
    library holds a file it failed to write (:func:`_exit_if_native_files_are_stuck`) or the
    interpreter's finalisation must be skipped (:data:`EXIT_AFTER_ATEXIT`)."""
    _exit_if_native_files_are_stuck(code)
    if EXIT_AFTER_ATEXIT:
        exit_after_atexit(code)
    return code


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)``; print a :class:`UserError` (also one wrapped by TF or DALI), memory that
    could not be allocated (:func:`out_of_memory`) or a write that failed where the command did not
    say so itself (:func:`write_error_line`) as ``error: <message>`` on stderr and return 2.

    Returns ``main``'s return value (``None`` counts as 0). ``KeyboardInterrupt`` prints its message
    (or ``interrupted``) and returns its ``exit_code`` (130 unless it carries another), or, with JAX or
    TensorFlow loaded, ends the process with it at once (:func:`_exit_before_device_work_ends`); a
    closed stdout (``... | head``) returns 0 with the rest of the output discarded.
    """
    try:
        code = main(argv)
    except UserError as err:
        say(f"error: {err}")
        return _error_exit(2)
    except BrokenPipeError:  # the reader of stdout went away (``... | head``): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        message = (
            user_error_in(err) or name_too_long(err) or symlink_loop(err) or out_of_memory(err) or write_error_line(err)
        )
        if message is None:
            raise
        say(f"error: {message}")
        return _error_exit(2)
    except Exception as err:
        message = user_error_in(err) or out_of_memory(err)
        if message is None:
            raise
        say(f"error: {message}")
        return _error_exit(2)
    except KeyboardInterrupt as err:  # Ctrl-C, or a signal turned into one (shared_data.runtime.signals)
        say(str(err) or "interrupted")
        code = getattr(err, "exit_code", 130)
        _exit_before_device_work_ends(code)
        return code
    return 0 if code is None else int(code)
