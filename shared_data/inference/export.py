"""Export a trained U-Net in a framework's own format: the framework-neutral part of ``export``.

    python -m jax_impl.export --config cpu_tiny --weights W.npz --out exported/   # unet.jax_export
    python -m tf_impl.export  --config cpu_tiny --workdir runs/cpu_tiny/tf --out exported/   # saved_model/, unet.keras

Both frameworks' ``export`` run :func:`main` with the same flags; each supplies only the writer of its
artefacts (:mod:`jax_impl.export`, :mod:`tf_impl.export`). Beside them ``export.json`` records what
was exported: framework, config, weights or checkpoint, precision, the input and output signature
(NDHWC float32, batch dimension free, spatial side free (any multiple of 2**levels) or ``--size``)
and the code version. The exported network takes and returns the stored (transformed) units of
:mod:`shared_data.data.generate`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core import config_checks
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.core.files import check_not_input, check_writable, one_set_or_none, write_atomic, writing
from shared_data.inference import predict as predict_mod
from shared_data.inference import tiling
from shared_data.inference import weights as weights_mod
from shared_data.runtime import memory
from shared_data.runtime.logs import setup_logging
from shared_data.runtime.records import code_version

log = logging.getLogger("dlas.export")
RECORD = "export.json"


def build_parser(framework: str) -> argparse.ArgumentParser:
    """The ``export`` flags, the same for both frameworks."""
    name = {"jax": "JAX (jax.export)", "tf": "TensorFlow (SavedModel and .keras)"}[framework]
    p = make_parser(f"{framework}_impl.export", f"Export the U-Net: {name}.")
    predict_mod.add_config_args(p)
    weights_mod.add_weights_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--out", required=True, help="output folder (created; its export files are replaced)")
    g.add_argument(
        "--size",
        type=int,
        help="a fixed spatial side for the exported input (default: any side that is a multiple of 2**levels)",
    )
    g.add_argument(
        "--precision", choices=predict_mod.PRECISIONS, default="float32", help="compute type (default: %(default)s)"
    )
    return p


def check_size(cfg: Config, size: int | None) -> int | None:
    """The exported side: ``size``, or None for any multiple of ``2**levels``.

    Raises:
        UserError: ``size`` is not a positive multiple of ``2**levels`` or lies above the largest crop
            side (``MAXIMA["crop_size"]`` of :mod:`shared_data.core.config_checks`), the same in both frameworks.
    """
    align, largest = tiling.alignment(cfg), config_checks.MAXIMA["crop_size"]
    if size is not None and (size < align or size % align or size > largest):
        raise UserError(f"--size {size}: expected a multiple of 2**levels = {align} from {align} to {largest}")
    return size


def signature(cfg: Config, size: int | None) -> dict:
    """The exported function's input and output: NDHWC float32, batch free (``null``), the spatial
    side ``size`` or free (``null``, any multiple of ``side_multiple_of``; the three sides equal)."""
    shape = lambda channels: [None, size, size, size, channels]
    return {
        "input": {"shape": shape(cfg.N_in_channels), "dtype": "float32", "layout": "NDHWC"},
        "output": {"shape": shape(cfg.N_out_channels), "dtype": "float32", "layout": "NDHWC"},
        "side_multiple_of": tiling.alignment(cfg),
    }


def any_side_config(cfg: Config) -> Config:
    """``cfg`` with one formulation of the convolutions at every level: a model exported for any side
    cannot choose the plain forms by a level's side (the same math either way)."""
    return config_mod.replace(cfg, downconv_strided_below=0, upconv_transpose_below=0)


def main(
    framework: str,
    argv: Sequence[str] | None,
    *,
    banner: str,
    load_weights: Callable[[Config, str | None, str | None], tuple[dict, str]],
    export: Callable[[Config, dict, Path, int | None], list[str]],
    versions: Callable[[], dict],
    files: Sequence[str],
) -> int:
    """The ``export`` command of both frameworks: parse, load the weights, ``export(cfg, weights,
    out_dir, size) -> [file names written in out_dir]`` (``files``: the names it writes, each refused
    as an input before any work), write ``export.json``. A failed write (a full disk) leaves no part
    of the new export in ``--out`` and no folder it made (:func:`one_set_or_none`)."""
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    cfg = predict_mod.prediction_config(predict_mod.config_from_args(args), args.precision)
    size = check_size(cfg, args.size)
    out = Path(args.out)
    check_writable(out, "--out", folder=True)
    outputs = {f"--out's {name}": out / name for name in [*files, RECORD]}
    check_not_input(outputs, weights_mod.weights_inputs(args), "export")
    memory.check_address_space(
        framework, "export", "restoring the weights and tracing the model", memory.EXPORT_RESERVE_BYTES,
        "nothing is written",
    )  # fmt: skip
    weights, source = load_weights(cfg, args.weights, args.workdir)
    log.info("%s; config %r, %s, %s compute", banner, cfg.name, source, args.precision)
    with one_set_or_none(out, [out / name for name in [*files, RECORD]]):
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
            files = export(cfg, weights, out, size)
        record = {
            "framework": framework,
            "files": files,
            "config": cfg.name,
            "config_values": config_mod.config_dict(cfg),
            "weights": source,
            "precision": args.precision,
            **signature(cfg, size),
            "code": code_version(),
            "versions": versions(),
        }
        with writing(out / RECORD):
            write_atomic(out / RECORD, json.dumps(record, indent=1))
    for name in [*files, RECORD]:
        log.info("wrote %s", out / name)
    return 0
