"""The console scripts (``dlas-train-jax``, ``dlas-benchmark``, ...): each imports its command's module
only when run, so a missing optional framework ends in one ``error:`` line naming what to install,
and ``python -m <module>`` stays the same command."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from shared_data.core.errors import MissingDependencyError, run_cli

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
}


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


def _entry(name: str) -> Callable[[], int]:
    def run() -> int:
        return run_cli(lambda argv: load_main(name)(argv))

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
