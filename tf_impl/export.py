"""Export the U-Net with TensorFlow: ``python -m tf_impl.export --config cpu_tiny --weights W.npz --out DIR``.

Writes, for input float32 (B, s, s, s, N_in) NDHWC with a free batch ``B`` and a free side ``s``
(any multiple of 2**levels; or the fixed ``--size``), output float32 (B, s, s, s, N_out):

* ``DIR/saved_model/``: a SavedModel (Keras ``model.export``) with the endpoint ``serve``; it runs
  with TensorFlow alone, without this project's code::

      import tensorflow as tf
      y = tf.saved_model.load("DIR/saved_model").serve(tf.constant(x)).numpy()

* ``DIR/unet.keras``: the Keras model file, built from Keras' own layers (``Conv3D``,
  ``Conv3DTranspose``: :func:`tf_impl.model.build_model` with ``stock_layers``), so it loads in Keras 3
  without this project's code::

      import keras
      y = keras.saving.load_model("DIR/unet.keras")(x)

Mirrors :mod:`jax_impl.export`; flags, weights and ``DIR/export.json`` are :mod:`shared_data.inference.export`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.core.files import atomic_dir, atomic_path
from shared_data.inference import export as export_mod

from tf_impl import distribute
from tf_impl import model as model_mod
from tf_impl import predict as predict_tf

FRAMEWORK = "tf"
SAVED_MODEL = "saved_model"
KERAS_FILE = "unet.keras"


def build_exported_model(
    cfg: Config, weights: dict[str, np.ndarray], size: int | None, stock_layers: bool = False
) -> keras.Model:
    """``cfg``'s Keras model for inputs of side ``size`` or, for ``None``, any multiple of 2**levels
    (batch free) holding ``weights``; ``stock_layers``: of Keras' own layers alone
    (:func:`tf_impl.model.build_model`)."""
    if size is None:
        model = model_mod.build_model(export_mod.any_side_config(cfg), free_side=True, stock_layers=stock_layers)
    else:
        model = model_mod.build_model(config_mod.replace(cfg, crop_size=size), stock_layers=stock_layers)
    return model_mod.params_from_canonical(model, weights)


def export(cfg: Config, weights: dict[str, np.ndarray], out: Path, size: int | None) -> list[str]:
    """Write ``out/saved_model/`` (the kit's layers, traced into a graph) and ``out/unet.keras``
    (Keras' own layers), each atomically; return their names."""
    with atomic_dir(out / SAVED_MODEL) as tmp:
        build_exported_model(cfg, weights, size).export(str(tmp), format="tf_saved_model", verbose=False)
    with atomic_path(out / KERAS_FILE, ".keras") as tmp:
        build_exported_model(cfg, weights, size, stock_layers=True).save(tmp)
    return [SAVED_MODEL, KERAS_FILE]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tf_impl.export``: the shared command line (:func:`shared_data.inference.export.main`)."""
    return export_mod.main(
        FRAMEWORK,
        argv,
        banner=distribute.banner(),
        load_weights=predict_tf.load_weights,
        export=export,
        versions=distribute.versions,
        files=[SAVED_MODEL, KERAS_FILE],
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
