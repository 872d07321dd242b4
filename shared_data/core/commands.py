"""The kit's commands by name: the table of console scripts, and how a user spells a command.

A usage line, and every command an error message suggests, names the command the way the user runs
the kit: the console script (``dlas-generate``) when they typed one, else ``python -m <module>``.
:func:`make_parser` gives every command that usage line and ``--version``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from shared_data.core.errors import bounded, did_you_mean, run_cli

#: console script -> (module, the optional dependency it needs, the extra that installs it)
COMMANDS = {
    "train_jax": ("jax_impl.train", "jax", "jax"),
    "train_tf": ("tf_impl.train", "tensorflow", "tf"),
    "benchmark": ("dlas_compare.benchmark", None, None),
    "compare": ("dlas_compare.compare", None, None),
    "summary": ("dlas_compare.summary", None, None),
    "plots": ("dlas_compare.plots", None, None),
    "breakdown": ("dlas_compare.step_breakdown", "jax", "jax"),
    "doctor": ("dlas_compare.doctor", None, None),
    "generate": ("shared_data.data.generate", None, None),
    "inspect": ("shared_data.data.inspect", None, None),
    "convert": ("shared_data.data.convert", None, None),
    "ladder": ("dlas_compare.ladder", None, None),
    "predict_jax": ("jax_impl.predict", "jax", "jax"),
    "predict_tf": ("tf_impl.predict", "tensorflow", "tf"),
    "export_jax": ("jax_impl.export", "jax", "jax"),
    "export_tf": ("tf_impl.export", "tensorflow", "tf"),
    "validate": ("shared_data.inference.validate", None, None),
    "side_by_side": ("dlas_compare.side_by_side", None, None),
}

#: module -> its console script (``jax_impl.train`` -> ``dlas-train-jax``)
SCRIPTS = {module: "dlas-" + name.replace("_", "-") for name, (module, _, _) in COMMANDS.items()}


def command_name(module: str) -> str:
    """How a user runs ``module`` in this process's terms: its console script when the user typed one
    (``dlas-generate`` while ``dlas-train-jax`` runs), else ``python -m <module>``; for usage lines
    and for the commands that error messages suggest."""
    typed = Path(sys.argv[0]).name if sys.argv else ""
    if typed.startswith("dlas-") and module in SCRIPTS:
        return SCRIPTS[module]
    return f"python -m {module}"


def package_version() -> str:
    """The ``dlas-cosmo`` version of the code that runs: from the checkout's ``pyproject.toml`` when it
    runs from one (the source tree beside this package), else the installed package's; ``unknown``
    when neither says."""
    from importlib import metadata

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "dlas-cosmo" and "version" in project:
            return str(project["version"])
    try:
        return metadata.version("dlas-cosmo")
    except metadata.PackageNotFoundError:
        return "unknown"


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors (an unknown flag, a bad choice, a missing value) are one
    line, ``<command>: error: <what> (--help lists the flags)``, exit code 2, without the usage block
    argparse prints first: every bad input of the kit ends in one ``error:`` line. An unknown flag
    close to a known one gets ``(did you mean '--enable_amp'?)`` instead of the pointer to ``--help``."""

    def error(self, message: str):
        hint = "--help lists the flags"
        if message.startswith("unrecognized arguments: "):
            flags = [w.split("=")[0] for w in message.split(": ", 1)[1].split() if w.startswith("-")]
            close = [did_you_mean(f, self._option_string_actions) for f in flags]
            hint = next((c.strip(" ()") for c in close if c), hint)
        self.exit(2, f"{self.prog}: error: {bounded(message)} ({hint})\n")  # argparse quotes the value given


def make_parser(module: str, description: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """The parser of command ``module``: its usage names the command as the user typed it
    (:func:`command_name`), it takes ``--version`` and its errors are one line (:class:`OneLineErrorParser`)."""
    parser = OneLineErrorParser(prog=command_name(module), description=description, **kwargs)
    parser.add_argument("--version", action="version", version=f"%(prog)s (dlas-cosmo {package_version()})")
    return parser


#: console script -> (the framework-neutral module whose ``build_parser(framework)`` its command uses,
#: the module whose ``config_from_args(args)`` loads its config, framework)
PARSERS = {
    "train_jax": ("shared_data.runtime.cli", "shared_data.core.config_cli", "jax"),
    "train_tf": ("shared_data.runtime.cli", "shared_data.core.config_cli", "tf"),
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


def command_module() -> str | None:
    """The module that ``python -m`` runs in this process (``sys.orig_argv``), else None."""
    argv = list(getattr(sys, "orig_argv", []))
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


def answer_before_import(package: str) -> None:
    """Under ``python -m <package>.<command>`` (``tf_impl.train``, ``jax_impl.predict``, ...), answer
    ``--help``, ``--version``, flag and config errors while ``package`` imports, before its framework
    loads (the command's module imports it at its top): one ``error:`` line and exit 2 for a bad input.
    Does nothing under any other command (``sys.orig_argv`` names the module that ``-m`` runs)."""
    module = command_module()
    if module is None:
        return
    argv = list(sys.orig_argv)
    at = argv.index("-m")
    name = next((n for n, (m, _, _) in COMMANDS.items() if m == module and n in PARSERS), None)
    if module.split(".")[0] != package or name is None:
        return
    code = run_cli(lambda rest: check_arguments(name, rest), argv[at + 2 :])
    if code:
        raise SystemExit(code)
