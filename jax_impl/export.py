"""Export the U-Net with ``jax.export``: ``python -m jax_impl.export --config cpu_tiny --weights W.npz --out DIR``.

Writes ``DIR/unet.jax_export``: the serialized ``jax.export.Exported`` of the forward pass with the
weights baked in as constants, input float32 (B, s, s, s, N_in) NDHWC with a symbolic batch ``B``
and a symbolic side ``s = 2**levels * k`` (or the fixed ``--size``), output float32 (B, s, s, s,
N_out), lowered for CPU and CUDA. It runs with JAX alone, without this project's code::

    import jax, numpy as np
    exported = jax.export.deserialize(open("DIR/unet.jax_export", "rb").read())
    y = np.asarray(exported.call(x))   # x: float32 (B, s, s, s, 4), any B, any s a multiple of 2**levels

Mirrors :mod:`tf_impl.export`; flags, weights and ``DIR/export.json`` are :mod:`shared_data.inference.export`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from shared_data.core.config import Config
from shared_data.core.errors import run_cli
from shared_data.core.files import write_atomic
from shared_data.inference import export as export_mod
from shared_data.inference import tiling

from jax_impl import distribute
from jax_impl import model as model_mod
from jax_impl import predict as predict_jax

FRAMEWORK = "jax"
FILE = "unet.jax_export"
PLATFORMS = ("cpu", "cuda")


def exported_forward(cfg: Config, weights: dict[str, np.ndarray], size: int | None) -> jax.export.Exported:
    """The ``jax.export.Exported`` forward pass of ``cfg``'s model with ``weights`` as constants, for
    input float32 (B, s, s, s, N_in), B symbolic, ``s = size`` or, for ``None``, symbolic
    ``2**levels * k``; lowered for :data:`PLATFORMS`."""
    if size is None:
        cfg = export_mod.any_side_config(cfg)
    model = model_mod.build_model(cfg)
    params = model_mod.params_from_canonical(weights)
    forward = jax.jit(lambda x: model.apply({"params": params}, x))
    align = tiling.alignment(cfg)
    batch, side = jax.export.symbolic_shape(f"B, {align}*k" if size is None else f"B, {size}")
    spec = jax.ShapeDtypeStruct((batch, side, side, side, cfg.N_in_channels), jnp.float32)
    return jax.export.export(forward, platforms=PLATFORMS)(spec)


def export(cfg: Config, weights: dict[str, np.ndarray], out: Path, size: int | None) -> list[str]:
    """Write ``out/unet.jax_export`` (atomically); return the file names written."""
    write_atomic(out / FILE, bytes(exported_forward(cfg, weights, size).serialize()))
    return [FILE]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jax_impl.export``: the shared command line (:func:`shared_data.inference.export.main`)."""
    return export_mod.main(
        FRAMEWORK,
        argv,
        banner=distribute.banner(),
        load_weights=predict_jax.load_weights,
        export=export,
        versions=distribute.versions,
        files=[FILE],
    )


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
