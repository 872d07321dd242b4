"""User-facing errors and the one place that turns them into a one-line message and exit code 2.

Every error a user can cause (a bad config key, a missing file, a malformed dataset) is raised as a
subclass of :class:`UserError` whose message names the file, key or value and what was expected.
Command-line entry points wrap their ``main`` with :func:`run_cli`, so such errors never end in a
traceback; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import sys
from typing import Callable, Sequence


class UserError(Exception):
    """An error caused by the user's input; the message is complete and printed as is."""


class ConfigError(UserError):
    """A config file, config name, key, value or command-line override is invalid."""


class DatasetError(UserError):
    """A dataset file is missing or breaks the dataset contract (keys, shapes, dtypes, values)."""


class MissingDependencyError(UserError):
    """An optional dependency (DALI, TensorFlow, ...) is not installed; the message names the extra."""


def run_cli(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)``; print a :class:`UserError` as ``error: <message>`` on stderr and return 2.

    Returns ``main``'s return value (``None`` counts as 0). ``KeyboardInterrupt`` returns 130.
    """
    try:
        code = main(argv)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0 if code is None else int(code)
