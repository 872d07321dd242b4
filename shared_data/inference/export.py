"""Export a trained U-Net in a framework's own format: the framework-neutral part of ``export``.

    python -m jax_impl.export --config cpu_tiny --weights W.npz --out exported/   # unet.jax_export
    python -m tf_impl.export  --config cpu_tiny --workdir runs/cpu_tiny/tf --out exported/   # saved_model/, unet.keras

Both frameworks' ``export`` run :func:`main` with the same flags; each supplies only the writer of its
artefacts (:mod:`jax_impl.export`, :mod:`tf_impl.export`). Beside them ``export.json`` records what
was exported: framework, config, weights or checkpoint, precision, the input and output signature
(NDHWC float32, batch dimension free, spatial side ``--size``) and the code version. The exported
network takes and returns the stored (transformed) units of :mod:`shared_data.data.generate`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.core.files import write_atomic
from shared_data.inference import predict as predict_mod
from shared_data.runtime.logs import setup_logging
from shared_data.runtime.records import code_version

log = logging.getLogger("dlas.export")
RECORD = "export.json"


def build_parser(framework: str) -> argparse.ArgumentParser:
    """The ``export`` flags, the same for both frameworks."""
    name = {"jax": "JAX (jax.export)", "tf": "TensorFlow (SavedModel and .keras)"}[framework]
    p = make_parser(f"{framework}_impl.export", f"Export the U-Net: {name}.")
    predict_mod.add_config_args(p)
    predict_mod.add_weights_args(p)
    g = p.add_argument_group("export")
    g.add_argument("--out", required=True, help="output folder (created; its export files are replaced)")
    g.add_argument("--size", type=int, help="spatial side of the exported input (default: the config's crop_size)")
    g.add_argument(
        "--precision", choices=predict_mod.PRECISIONS, default="float32", help="compute type (default: %(default)s)"
    )
    return p


def check_size(cfg: Config, size: int | None) -> int:
    """The exported side: ``size`` or ``crop_size``.

    Raises:
        UserError: ``size`` is not a positive multiple of ``2**levels``.
    """
    align = predict_mod.alignment(cfg)
    size = cfg.crop_size if size is None else size
    if size < align or size % align:
        raise UserError(f"--size {size}: expected a positive multiple of 2**levels = {align}")
    return size


def signature(cfg: Config, size: int) -> dict:
    """The exported function's input and output: NDHWC float32, batch free (``null``)."""
    return {
        "input": {"shape": [None, size, size, size, cfg.N_in_channels], "dtype": "float32", "layout": "NDHWC"},
        "output": {"shape": [None, size, size, size, cfg.N_out_channels], "dtype": "float32", "layout": "NDHWC"},
    }


def main(
    framework: str,
    argv: Sequence[str] | None,
    *,
    banner: str,
    load_weights: Callable[[Config, str | None, str | None], tuple[dict, str]],
    export: Callable[[Config, dict, Path, int], list[str]],
    versions: Callable[[], dict],
) -> int:
    """The ``export`` command of both frameworks: parse, load the weights, ``export(cfg, weights,
    out_dir, size) -> [file names written in out_dir]``, write ``export.json``."""
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    cfg = predict_mod.prediction_config(predict_mod.config_from_args(args), args.precision)
    size = check_size(cfg, args.size)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, expected a folder")
    weights, source = load_weights(cfg, args.weights, args.workdir)
    log.info("%s; config %r, %s, %s compute", banner, cfg.name, source, args.precision)
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
    write_atomic(out / RECORD, json.dumps(record, indent=1))
    for name in [*files, RECORD]:
        log.info("wrote %s", out / name)
    return 0
