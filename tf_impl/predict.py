"""Predict the gas fields of an HDF5 volume with TensorFlow:
``python -m tf_impl.predict --config cpu_tiny --weights W.npz --input vol.h5 --out pred.h5``.

Mirrors :mod:`jax_impl.predict`: only the TensorFlow part lives here (load canonical weights or a
run's latest checkpoint, apply the Keras model to batches of windows); reading, padding, the
output file and the log lines are :mod:`shared_data.inference.predict`, tiling and stitching
:mod:`shared_data.inference.tiling`, finding the weights :mod:`shared_data.inference.weights`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.inference import weights as weights_mod
from shared_data.runtime.logs import native_lines_filtered

from tf_impl import distribute
from tf_impl import model as model_mod
from tf_impl.checkpoints import Checkpoints

FRAMEWORK = "tf"


def restore_checkpoint(run_cfg: Config, directory: Path, workdir: str) -> tuple[dict[str, np.ndarray], int]:
    """The canonical weights of the newest checkpoint in ``directory`` that restores (with
    :class:`tf_impl.checkpoints.Checkpoints`, model variables only; a damaged one is skipped with a
    warning) and its epoch.

    Raises:
        UserError: no checkpoint, or none that restores (the newest one's error).
    """
    with Checkpoints(directory, run_cfg.keep_checkpoints, read_only=True) as checkpoints:
        model = model_mod.build_model(run_cfg)
        epoch, model = weights_mod.restore_newest(checkpoints, workdir, lambda e: checkpoints.restore_params(e, model))
    return model_mod.params_to_canonical(model), epoch


def load_weights(cfg: Config, weights: str | None, workdir: str | None) -> tuple[dict[str, np.ndarray], str]:
    """:func:`shared_data.inference.weights.load_weights` with this framework's checkpoints."""
    return weights_mod.load_weights(cfg, weights, workdir, restore_checkpoint)


def make_apply(cfg: Config, weights: dict[str, np.ndarray]) -> tiling.Apply:
    """The forward pass of ``cfg``'s model with ``weights`` (XLA-compiled when ``enable_jit``):
    NDHWC float32 windows (B, w, w, w, N_in) -> (B, w, w, w, N_out) float32 NumPy. A Keras model
    has a fixed spatial shape, so one is built per window side."""
    forwards = {}

    def apply(x: np.ndarray) -> np.ndarray:
        side = x.shape[1]
        first = side not in forwards
        if first:
            model = model_mod.build_model(config_mod.replace(cfg, crop_size=side))
            model_mod.params_from_canonical(model, weights)
            forwards[side] = tf.function(lambda v, m=model: m(v, training=False), jit_compile=cfg.enable_jit)
        # the first call compiles: a hit of TF's XLA cache logs false errors
        with native_lines_filtered() if first else contextlib.nullcontext():
            return forwards[side](tf.constant(x, tf.float32)).numpy()

    return apply


def forward_fn(cfg: Config):
    """The forward pass of ``cfg``'s model for the weights of the moment, ``forward(model)(x)``: the
    values of ``model``'s trainable variables (the trainer's model) when ``forward`` is called are
    copied into a model of the window's side (built once per side), which
    maps NDHWC float32 windows (B, w, w, w, N_in) -> (B, w, w, w, N_out) float32 NumPy (the
    trainer's time-to-quality mode)."""
    models, forwards = {}, {}

    def bind(model) -> tiling.Apply:
        values, fresh = [tf.identity(v) for v in model.trainable_variables], set()

        def apply(x: np.ndarray) -> np.ndarray:
            side = x.shape[1]
            first = side not in models
            if first:
                models[side] = model_mod.build_model(config_mod.replace(cfg, crop_size=side))
                forwards[side] = tf.function(lambda v, m=models[side]: m(v, training=False), jit_compile=cfg.enable_jit)
            if side not in fresh:
                for dst, src in zip(models[side].trainable_variables, values, strict=True):
                    dst.assign(src)
                fresh.add(side)
            # the first call compiles: a hit of TF's XLA cache logs false errors
            with native_lines_filtered() if first else contextlib.nullcontext():
                return forwards[side](tf.constant(x, tf.float32)).numpy()

        return apply

    return bind


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_impl.predict``: the shared command line (:func:`shared_data.inference.predict.main`)."""
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
