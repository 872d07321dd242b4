"""Apply a trained U-Net to an HDF5 volume: the framework-neutral part of ``predict`` and ``export``.

    python -m jax_impl.predict --config cpu_tiny --weights W.npz --input data/val_64.h5 --out pred.h5
    python -m tf_impl.predict  --config cpu_tiny --workdir runs/cpu_tiny/tf --input data/val_64.h5 --out pred.h5

Both frameworks' ``predict`` run :func:`main`; each supplies only its framework part: load the
weights (a canonical ``.npz`` file or a run's latest checkpoint, :mod:`shared_data.inference.weights`)
and apply the network to a batch of windows. This module owns the command line (the config flags
``export`` shares too), reading the input, the output file and the log lines, so the two commands
take the same flags and print the same lines; the windows and their stitching are
:mod:`shared_data.inference.tiling`.

Input: a file of the dataset contract (:mod:`shared_data.data.dataset`); only ``Nbody`` (N_in, L, L, L)
float32 channel-first is read (``Hydro`` may be absent), so any cubic side works. A side that is not a
multiple of ``2**levels`` is zero-padded and the prediction cropped back; one log line says so. The
default ``--overlap`` is the receptive margin (seamless); a smaller one is accepted with a warning.

Output: an HDF5 file with dataset ``Hydro`` (N_out, L, L, L) float32 channel-first, in the stored
(transformed) units of the input's targets, the input file's attributes copied (channel names,
transforms, units, box size, ...) and the prediction's provenance added (``prediction_*``
attributes: framework, weights or checkpoint, config, precision, tiling, input, code version),
written atomically.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import DatasetError, UserError
from shared_data.core.files import check_not_input, check_writable, write_atomic, writing
from shared_data.data import dataset
from shared_data.inference import tiling
from shared_data.inference.weights import add_weights_args, weights_inputs
from shared_data.model import unet_spec
from shared_data.runtime import memory
from shared_data.runtime.logs import setup_logging
from shared_data.runtime.records import code_version

log = logging.getLogger("dlas.predict")

PRECISIONS = ("float32", "bfloat16")


# --- reading and writing ----------------------------------------------------------------------


def read_input(path: str | Path, n_in: int) -> tuple[np.ndarray, dict]:
    """The ``Nbody`` volume of ``path`` as (L, L, L, N_in) float32 channels-last, and the file's
    attributes as h5py reads them (copied unchanged into the prediction).

    Raises:
        DatasetError: the file is missing or unreadable; ``Nbody`` is missing, not 4-D
            channel-first with ``n_in`` channels, not float32, not cubic, holds NaN or inf, or differs
            from the CRC-32 its attributes record.
    """
    path = Path(path)
    with dataset.open_h5(path) as f, dataset.reading(path, "Nbody"):
        if "Nbody" not in f or not hasattr(f["Nbody"], "shape"):
            raise DatasetError(
                f"{path}: missing dataset 'Nbody' (expected ({n_in}, L, L, L) float32; found keys {sorted(f.keys())})"
            )
        ds = f["Nbody"]
        if ds.ndim != 4 or ds.shape[0] != n_in:
            raise DatasetError(
                f"{path}: 'Nbody' has shape {ds.shape}, expected ({n_in}, L, L, L): {n_in} channels first, "
                f"the config's N_in_channels"
            )
        if ds.dtype != np.float32:
            raise DatasetError(f"{path}: 'Nbody' has dtype {ds.dtype}, expected float32 (the dataset contract)")
        if len(set(ds.shape[1:])) != 1:
            raise DatasetError(f"{path}: 'Nbody' has spatial shape {ds.shape[1:]}, expected a cube (L, L, L)")
        nbody = ds[...]
        attrs = dict(f.attrs.items())
    dataset.check_finite(nbody, f"{path} Nbody")
    checksum = dataset.ChannelChecksum(path, attrs, "Nbody")
    checksum.update(nbody)
    checksum.verify()
    return np.ascontiguousarray(np.moveaxis(nbody, 0, -1)), attrs


def write_prediction(path: str | Path, hydro: np.ndarray, attrs: dict) -> None:
    """Write ``hydro`` (L, L, L, N_out) as dataset ``Hydro`` (N_out, L, L, L) float32, chunks
    (1, c, c, c) with c = min(32, L), and ``attrs`` (JSON text for dicts and lists), atomically. The
    input's checksum attributes (``*_crc32``) describe other values, so they are replaced by the
    prediction's own ``Hydro_crc32``."""
    import h5py

    data = np.ascontiguousarray(np.moveaxis(hydro, -1, 0), np.float32)
    attrs = {k: v for k, v in attrs.items() if k.startswith("prediction_") or not k.endswith("_crc32")}
    attrs["Hydro_crc32"] = dataset.channel_crc32(data)
    c = min(32, data.shape[1])
    # built in memory and written as bytes: a full disk is a plain OSError, and HDF5 holds no file
    # it cannot close (which would crash the interpreter's exit)
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        f.create_dataset("Hydro", data=data, chunks=(1, c, c, c))
        for k, v in attrs.items():
            f.attrs[k] = json.dumps(v) if isinstance(v, (dict, list, tuple)) else v
    with writing(path):
        write_atomic(path, image.getvalue())


def check_prediction(hydro: np.ndarray, source: str) -> None:
    """Check a prediction (L, L, L, N_out) before it is written: the network ends in tanh, so a
    NaN or inf comes from weights or an input the network overflowed on.

    Raises:
        UserError: the first non-finite voxel and channel, and how many there are; nothing is written.
    """
    bad = dataset.first_bad(hydro, np.inf)
    if bad is not None:
        count = int((~np.isfinite(hydro)).sum())
        raise UserError(
            f"the prediction with {source} holds {hydro[bad]} at voxel {bad[:3]}, channel {bad[3]} "
            f"({count} of {hydro.size} values not finite): the network overflowed; nothing was written"
        )


# --- the config and the command line -----------------------------------------------------------


def prediction_config(cfg: Config, precision: str) -> Config:
    """``cfg`` computing in ``precision`` (``float32`` or ``bfloat16``), nothing trained."""
    return config_mod.replace(
        cfg,
        enable_amp=precision != "float32",
        amp_dtype="bfloat16" if precision == "bfloat16" else cfg.amp_dtype,
        grad_allreduce_dtype="float32",
    )


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """``--yaml_config``, ``--config`` and ``--set KEY=VALUE`` (the trainers' spelling)."""
    g = parser.add_argument_group("configuration")
    g.add_argument("--yaml_config", default=str(config_mod.DEFAULT_YAML), help="YAML file of named configs")
    g.add_argument("--config", default="cpu_default", help=config_cli.config_help())
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (YAML)")
    g.add_argument(
        "--enable_jit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="XLA compilation of TF's forward pass, as the trainers' flag (JAX always compiles)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """The config named by ``args`` with its ``--set`` overrides."""
    overrides = dict(config_cli.parse_override(s) for s in args.set)
    if getattr(args, "enable_jit", None) is not None:
        overrides["enable_jit"] = args.enable_jit
    return config_mod.load_config(args.config, args.yaml_config, overrides)


def build_parser(framework: str) -> argparse.ArgumentParser:
    """The ``predict`` flags, the same for both frameworks."""
    name = {"jax": "JAX", "tf": "TensorFlow"}[framework]
    p = make_parser(
        f"{framework}_impl.predict",
        f"Predict the gas fields of an HDF5 volume with the {name} U-Net.",
    )
    add_config_args(p)
    add_weights_args(p)
    g = p.add_argument_group("prediction")
    g.add_argument("--input", required=True, help="HDF5 file with Nbody (N_in, L, L, L) float32, any side L")
    g.add_argument("--out", required=True, help="output HDF5 file (dataset Hydro, the input's attributes)")
    g.add_argument("--precision", choices=PRECISIONS, default="float32", help="compute type (default: %(default)s)")
    g.add_argument("--tile", type=int, help="window side (multiple of 2**levels); 0: the whole volume (default: auto)")
    g.add_argument("--overlap", type=int, help="context per inner window side (default: the receptive margin)")
    g.add_argument("--batch_size", type=int, default=1, help="windows per call (default: %(default)s)")
    g.add_argument(
        "--memory_gb",
        type=float,
        default=tiling.DEFAULT_MEMORY_GB,
        help="activation budget that picks whole-volume vs tiles when --tile is not given (default: %(default)s)",
    )
    g.add_argument("--validate", metavar="DIR", help="then validate against the input's Hydro into DIR")
    return p


def prediction_outputs(args: argparse.Namespace) -> dict[str, str | Path | None]:
    """The files ``predict`` writes: ``--out`` and, with ``--validate DIR``, DIR's report."""
    from shared_data.inference.validate import report_files

    outputs: dict[str, str | Path | None] = {"--out": args.out}
    if args.validate:
        outputs.update({f"--validate's {p.name}": p for p in report_files(args.validate)})
    return outputs


def check_args(args: argparse.Namespace, margin: int) -> None:
    """Reject flags that cannot work, before the model is built.

    Raises:
        UserError: output folder missing or not writable, output a folder, an output that is an
            input (:func:`prediction_outputs`, :func:`weights_inputs`), bad --batch_size /
            --overlap / --memory_gb, a --validate path that is a file.
    """
    out = Path(args.out)
    if not out.absolute().parent.exists():
        raise UserError(f"--out {out}: folder {out.absolute().parent} does not exist")
    check_writable(out, "--out")
    check_not_input(prediction_outputs(args), weights_inputs(args) | {"--input": args.input}, "prediction")
    if args.batch_size < 1:
        raise UserError(f"--batch_size {args.batch_size}: expected at least 1")
    if args.overlap is not None and args.overlap < 0:
        raise UserError(f"--overlap {args.overlap}: expected >= 0 (default: the receptive margin {margin})")
    if args.tile is not None and args.tile < 0:
        raise UserError(f"--tile {args.tile}: expected a window side, or 0 for the whole volume")
    if not args.memory_gb > 0:
        raise UserError(f"--memory_gb {args.memory_gb}: expected > 0")
    if args.validate and Path(args.validate).exists() and not Path(args.validate).is_dir():
        raise UserError(f"--validate {args.validate} is a file, expected a folder")


def main(
    framework: str,
    argv: Sequence[str] | None,
    *,
    banner: str,
    load_weights: Callable[[Config, str | None, str | None], tuple[dict, str]],
    make_apply: Callable[[Config, dict], tiling.Apply],
    versions: Callable[[], dict],
) -> int:
    """The ``predict`` command of both frameworks: parse, load the weights (``load_weights(cfg,
    weights, workdir) -> (canonical weights, description)``), plan, predict with
    ``make_apply(cfg, weights)``, write ``--out`` and, with ``--validate``, the validation report."""
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    cfg = prediction_config(config_from_args(args), args.precision)
    align, margin = tiling.alignment(cfg), unet_spec.receptive_margin(cfg)
    check_args(args, margin)
    overlap = margin if args.overlap is None else args.overlap
    x, attrs = read_input(args.input, cfg.N_in_channels)
    side = x.shape[0]
    input_crc32 = None if "Nbody_crc32" in attrs else json.dumps(dataset.channel_crc32(np.moveaxis(x, -1, 0)))
    size = tiling.padded_side(side, align)
    window = tiling.choose_window(cfg, size, args.tile, overlap, args.precision, args.memory_gb)
    memory.check_address_space(
        framework,
        "predict",
        "restoring the weights, compiling and predicting",
        memory.PREDICT_RESERVE_BYTES + 4 * cfg.N_out_channels * size**3,  # + the float32 prediction
        "nothing is written",
    )
    weights, source = load_weights(cfg, args.weights, args.workdir)

    log.info("%s; config %r, %s, %s compute", banner, cfg.name, source, args.precision)
    log.info("input: %s, Nbody %d x %d^3", args.input, cfg.N_in_channels, side)
    if size != side:
        log.info(
            "volume side %d is not a multiple of 2**levels = %d: zero-padded to %d, the prediction cropped back to %d",
            side,
            align,
            size,
            side,
        )
        x = np.pad(x, [(0, size - side)] * 3 + [(0, 0)])
    if window >= size:
        log.info("tiling: the whole volume (%d^3) at once (receptive margin %d voxels)", size, margin)
    else:
        log.info(
            "tiling: %d^3 windows, overlap %d voxels (receptive margin %d), batch %d",
            window,
            overlap,
            margin,
            args.batch_size,
        )
        if overlap < margin:
            log.warning(
                "overlap %d < receptive margin %d: voxels near inner tile faces differ from the whole-volume "
                "prediction (seams)",
                overlap,
                margin,
            )
    apply = make_apply(cfg, weights)
    t0 = time.perf_counter()
    hydro, tiles = tiling.predict_volume(
        x, apply, cfg.N_out_channels, window, overlap, align, args.batch_size, progress=window < size
    )
    seconds = time.perf_counter() - t0
    hydro = hydro[:side, :side, :side]
    check_prediction(hydro, source)
    log.info("predicted %d window(s) in %.1f s (compilation included)", tiles, seconds)
    provenance = {
        "prediction_framework": framework,
        "prediction_weights": source,
        "prediction_config": cfg.name,
        "prediction_config_values": config_mod.config_dict(cfg),
        "prediction_precision": args.precision,
        "prediction_tiling": {
            "side": side,
            "padded_side": size,
            "window": min(window, size),
            "overlap": overlap if window < size else 0,
            "receptive_margin": margin,
            "windows": tiles,
        },
        "prediction_input": str(Path(args.input).absolute()),
        "prediction_code": code_version(),
        "prediction_versions": versions(),
    }
    # identifies the input wherever it is moved (validate compares it); computed for a file without it
    provenance["prediction_input_Nbody_crc32"] = attrs.get("Nbody_crc32") or input_crc32
    write_prediction(args.out, hydro, {**attrs, **provenance})
    log.info("wrote %s: Hydro (%d, %d, %d, %d) float32", args.out, cfg.N_out_channels, side, side, side)
    if args.validate:
        from shared_data.inference import validate

        validate.validate_files(args.out, args.input, args.validate)
    return 0
