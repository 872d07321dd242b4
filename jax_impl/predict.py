"""Predict the gas fields of an HDF5 volume with JAX:
``python -m jax_impl.predict --config cpu_tiny --weights W.npz --input vol.h5 --out pred.h5``.

Mirrors :mod:`tf_impl.predict`: only the JAX part lives here (load canonical weights or a run's
latest orbax checkpoint, apply the Flax model to batches of windows); reading, padding, the
output file and the log lines are :mod:`shared_data.inference.predict`, tiling and stitching
:mod:`shared_data.inference.tiling`, finding the weights :mod:`shared_data.inference.weights`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.inference import weights as weights_mod

from jax_impl import distribute
from jax_impl import model as model_mod
from jax_impl.checkpoints import Checkpoints

FRAMEWORK = "jax"


def restore_checkpoint(run_cfg: Config, directory: Path, workdir: str) -> tuple[dict[str, np.ndarray], int]:
    """The canonical weights of the newest checkpoint in ``directory`` that restores (with
    :class:`jax_impl.checkpoints.Checkpoints`; a damaged one is skipped with a warning) and its epoch.

    Raises:
        UserError: no checkpoint, or none that restores (the newest one's error).
    """
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # orbax warns that a read-only manager is read-only
    try:
        checkpoints = Checkpoints(directory, run_cfg.keep_checkpoints, read_only=True)
    finally:
        absl.setLevel(level)
    with checkpoints:  # closed on every exit (orbax's threads)
        like = jax.eval_shape(lambda: model_mod.init_params(run_cfg, 0))
        epoch, params = weights_mod.restore_newest(checkpoints, workdir, lambda e: checkpoints.restore_params(e, like))
    return model_mod.params_to_canonical(jax.device_get(params)), epoch


def load_weights(cfg: Config, weights: str | None, workdir: str | None) -> tuple[dict[str, np.ndarray], str]:
    """:func:`shared_data.inference.weights.load_weights` with this framework's checkpoints."""
    return weights_mod.load_weights(cfg, weights, workdir, restore_checkpoint)


def forward_fn(cfg: Config):
    """The compiled forward pass of ``cfg``'s model for the parameters of the moment, ``forward(params)(x)``:
    Flax parameters bound, NDHWC float32 windows (B, w, w, w, N_in) -> (B, w, w, w, N_out) float32
    NumPy; compiled once per window shape (the trainer's time-to-quality mode binds the parameters it
    judges)."""
    model = model_mod.build_model(cfg)
    compiled = jax.jit(lambda p, x: model.apply({"params": p}, x))

    def bind(params) -> tiling.Apply:
        return lambda x: np.asarray(compiled(params, jnp.asarray(x, jnp.float32)))

    return bind


def make_apply(cfg: Config, weights: dict[str, np.ndarray]) -> tiling.Apply:
    """:func:`forward_fn` with the canonical ``weights``: windows -> outputs, as above."""
    return forward_fn(cfg)(jax.device_put(model_mod.params_from_canonical(weights)))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_impl.predict``: the shared command line (:func:`shared_data.inference.predict.main`)."""
    return predict_mod.main(
        FRAMEWORK,
        argv,
        banner=distribute.banner(),
        load_weights=load_weights,
        make_apply=make_apply,
        versions=distribute.versions,
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
