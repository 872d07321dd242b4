"""User-facing errors and the one place that turns them into a one-line message and exit code 2.

Every error a user can cause (a bad config key, a missing file, a malformed dataset) is raised as a
subclass of :class:`UserError` whose message names the file, key or value and what was expected.
Command-line entry points wrap their ``main`` with :func:`run_cli`, so such errors never end in a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence


class UserError(Exception):
    """An error caused by the user's input; the message is complete and printed as is."""


class ConfigError(UserError):
    """A config file, config name, key, value or command-line override is invalid."""


class DatasetError(UserError):
    """A dataset file is missing or breaks the dataset contract (keys, shapes, dtypes, values)."""


class MissingDependencyError(UserError):
    """An optional dependency (DALI, TensorFlow, ...) is not installed; the message names the extra."""


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'X'?)`` for the candidate closest to a mistyped ``word`` (``difflib``'s
    similarity ratio at least 0.6), else an empty string; for flag and config-key typos."""
    import difflib

    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_WRAPPED = re.compile(r"(?:UserError|ConfigError|DatasetError|MissingDependencyError): (.+)")


def user_error_in(err: BaseException) -> str | None:
    """The message of a :class:`UserError` that ``err`` is or wraps: raised inside a DALI callback
    (the chain's ``__cause__``) or a ``tf.data`` Python function (only its text survives)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, UserError):
            return str(err)
        match = _WRAPPED.search(str(err))
        if match:
            return match.group(1).strip()
        err = err.__cause__ or err.__context__
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
            print(f"error: {message}", file=sys.stderr)
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


#: Files that a native library (HDF5) holds open after a failed write (:mod:`shared_data.core.files`
#: adds them); while it is not empty, :func:`run_cli` ends the process with ``os._exit`` after flushing
#: its output.
EXIT_WITHOUT_FINALISERS: list[str] = []


def _exit_if_native_files_are_stuck(code: int) -> None:
    """End the process now with ``code`` when a native library holds a file it failed to write
    (:data:`EXIT_WITHOUT_FINALISERS`): its finalisers would retry the write at exit and crash after
    the error line. Output and log files are flushed first."""
    if EXIT_WITHOUT_FINALISERS and "pytest" not in sys.modules:  # a test's process goes on
        import logging
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)``; print a :class:`UserError` (also one wrapped by TF or DALI) as
    ``error: <message>`` on stderr and return 2.

    Returns ``main``'s return value (``None`` counts as 0). ``KeyboardInterrupt`` prints its message
    (or ``interrupted``) and returns its ``exit_code`` (130 unless it carries another); a
    closed stdout (``... | head``) returns 0 with the rest of the output discarded.
    """
    try:
        code = main(argv)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        _exit_if_native_files_are_stuck(2)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (``... | head``): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        message = user_error_in(err) or name_too_long(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except Exception as err:
        message = user_error_in(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or a signal turned into one (shared_data.runtime.signals)
        print(str(err) or "interrupted", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    return 0 if code is None else int(code)
