"""The console scripts (``dlas-train-jax``, ``dlas-benchmark``, ...): each imports its command's module
only when run, so a missing optional framework ends in one ``error:`` line naming what to install,
and ``python -m <module>`` stays the same command."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from shared_data.core.commands import COMMANDS
from shared_data.core.errors import MissingDependencyError, run_cli


def load_main(name: str) -> Callable:
    """The ``main`` of command ``name``.

    Raises:
        MissingDependencyError: the command's framework (or another package it imports) is missing.
    """
    module, needs, extra = COMMANDS[name]
    try:
        return importlib.import_module(module).main
    except ImportError as err:
        missing = err.name or needs or "a dependency"
        hint = (
            f"pip install 'dlas-cosmo[{extra}]'"
            if extra and missing.split(".")[0] == needs
            else f"pip install {missing}"
        )
        raise MissingDependencyError(f"{module} needs {missing}, which is not installed: {hint}") from None


#: console script -> (the framework-neutral module whose ``build_parser(framework)`` its command uses,
#: the module whose ``config_from_args(args)`` loads its config, framework)
PARSERS = {
    "train_jax": ("shared_data.runtime.cli", "shared_data.core.config", "jax"),
    "train_tf": ("shared_data.runtime.cli", "shared_data.core.config", "tf"),
    "predict_jax": ("shared_data.inference.predict", "shared_data.inference.predict", "jax"),
    "predict_tf": ("shared_data.inference.predict", "shared_data.inference.predict", "tf"),
    "export_jax": ("shared_data.inference.export", "shared_data.inference.predict", "jax"),
    "export_tf": ("shared_data.inference.export", "shared_data.inference.predict", "tf"),
}


def check_arguments(name: str, argv: Sequence[str] | None) -> None:
    """Parse ``argv`` with command ``name``'s parser and load its config, importing no framework:
    ``--help`` and ``--version`` exit 0 here, a flag error exits 2 (argparse's one line).

    Raises:
        ConfigError: a wrong ``--config``, ``--yaml_config`` or ``--set``.
    """
    parser_module, config_module, framework = PARSERS[name]
    args = importlib.import_module(parser_module).build_parser(framework).parse_args(argv)
    importlib.import_module(config_module).config_from_args(args)


def answer_before_import(package: str) -> None:
    """Under ``python -m <package>.<command>`` (``tf_impl.train``, ``jax_impl.predict``, ...), answer
    ``--help``, ``--version``, flag and config errors while ``package`` imports, before its framework
    loads (the command's module imports it at its top): one ``error:`` line and exit 2 for a bad input.
    Does nothing under any other command (``sys.orig_argv`` names the module that ``-m`` runs)."""
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" not in argv[:-1]:
        return
    at = argv.index("-m")
    module = argv[at + 1]
    name = next((n for n, (m, _, _) in COMMANDS.items() if m == module and n in PARSERS), None)
    if module.split(".")[0] != package or name is None:
        return
    code = run_cli(lambda rest: check_arguments(name, rest), argv[at + 2 :])
    if code:
        raise SystemExit(code)


def _entry(name: str) -> Callable[[], int]:
    def main(argv):
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
) = (_entry(n) for n in COMMANDS)
