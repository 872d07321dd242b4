"""The console scripts (``dlas-train-jax``, ``dlas-benchmark``, ...): each imports its command's module
only when run, so a missing optional framework ends in one ``error:`` line naming what to install,
and ``python -m <module>`` stays the same command."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from shared_data.core.commands import COMMANDS, PARSERS, check_arguments
from shared_data.core.errors import MissingDependencyError, UserError, out_of_memory, run_cli
from shared_data.runtime.launch import joins_workers
from shared_data.runtime.signals import guard_command, hold_sigterm


def load_main(name: str) -> Callable:
    """The ``main`` of command ``name``.

    Raises:
        MissingDependencyError: the command's framework (or another package it imports) is missing.
    """
    module, needs, extra = COMMANDS[name]
    try:
        return importlib.import_module(module).main
    except ImportError as err:
        if out_of_memory(err):  # a framework whose libraries cannot be mapped under ulimit -v
            raise UserError(out_of_memory(err)) from None
        missing = err.name or needs or "a dependency"
        hint = (
            f"pip install 'dlas-cosmo[{extra}]'"
            if extra and missing.split(".")[0] == needs
            else f"pip install {missing}"
        )
        raise MissingDependencyError(f"{module} needs {missing}, which is not installed: {hint}") from None


def _entry(name: str) -> Callable[[], int]:
    def main(argv):
        if name in ("train_jax", "train_tf"):  # SIGTERM and Ctrl-C while the framework imports: one sentence
            guard_command()
        if name == "train_tf" and joins_workers():  # SIGTERM held for the start's watchdog (tf_impl)
            hold_sigterm()
        if name in PARSERS:  # --help, --version, flag and config errors end here, before the framework imports
            check_arguments(name, argv)
        return load_main(name)(argv)

    def run() -> int:
        return run_cli(main)

    run.__name__ = name
    return run


(
    train_jax,
    train_tf,
    benchmark,
    compare,
    summary,
    plots,
    breakdown,
    doctor,
    generate,
    inspect,
    convert,
    ladder,
    predict_jax,
    predict_tf,
    export_jax,
    export_tf,
    validate,
    side_by_side,
) = (_entry(n) for n in COMMANDS)
