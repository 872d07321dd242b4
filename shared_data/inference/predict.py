"""Apply a trained U-Net to an HDF5 volume: the framework-neutral part of ``predict`` and ``export``.

    python -m jax_impl.predict --config cpu_tiny --weights W.npz --input data/val_64.h5 --out pred.h5
    python -m tf_impl.predict  --config cpu_tiny --workdir runs/cpu_tiny/tf --input data/val_64.h5 --out pred.h5

Both frameworks' ``predict`` run :func:`main`; each supplies only its framework part: load the
weights (a canonical ``.npz`` file or a run's latest checkpoint) and apply the network to a batch of
windows. This module owns everything else: reading the input, padding, the tiling plan, stitching,
the output file and the log lines, so the two commands take the same flags and print the same lines.

Input: a file of the dataset contract (:mod:`shared_data.data.dataset`); only ``Nbody`` (N_in, L, L, L)
float32 channel-first is read (``Hydro`` may be absent), so any cubic side works.

Side: the network halves the volume ``levels`` times, so a side must be a multiple of
``align = 2**levels``. Another side is zero-padded at the high end of each axis up to the next
multiple (zero is the stored value of mean density and rest: the transforms of
:mod:`shared_data.data.generate`) and the prediction is cropped back; one log line says so. Voxels within
the receptive margin of the padded faces then see the padding instead of the (absent) volume beyond.

Tiling: a U-Net output voxel depends on the input within ``receptive_margin(cfg)`` = 3 (2**levels - 1)
voxels per side (:func:`shared_data.model.unet_spec.receptive_margin`), and the network's arithmetic is
periodic with period ``align``. A window whose origin is a multiple of ``align`` therefore computes
the whole-volume result exactly (to float round-off) at every voxel whose distance to the window's
inner faces is at least the margin; at a face shared with the volume the window's zero padding is the
volume's. :func:`axis_plan` places equal windows so that each voxel is taken from one such position:
the tiled prediction equals the whole-volume prediction everywhere, not just away from the faces.
The default ``overlap`` is the margin (seamless); a smaller one is accepted with a warning (tiles
of the training crop size with overlap 0 reproduce crop-wise prediction, seams included).

Output: an HDF5 file with dataset ``Hydro`` (N_out, L, L, L) float32 channel-first, in the stored
(transformed) units of the input's targets, the input file's attributes copied (channel names,
transforms, units, box size, ...) and the prediction's provenance added (``prediction_*``
attributes: framework, weights or checkpoint, config, precision, tiling, input, code version),
written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import itertools
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core import config_checks, config_cli
from shared_data.core.commands import make_parser
from shared_data.core.config import Config
from shared_data.core.errors import ConfigError, DatasetError, UserError
from shared_data.core.files import check_not_input, check_writable, write_atomic, writing
from shared_data.data import dataset
from shared_data.model import unet_spec
from shared_data.runtime import memory
from shared_data.runtime.logs import progress as progress_bar
from shared_data.runtime.logs import setup_logging
from shared_data.runtime.records import code_version

log = logging.getLogger("dlas.predict")

PRECISIONS = ("float32", "bfloat16")
DEFAULT_MEMORY_GB = 16.0
#: Model keys that decide the shapes of the weights (a checkpoint restores only into the same ones).
MODEL_KEYS = ("N_in_channels", "N_out_channels", "unet_widths", "full_scale")

#: An ``apply`` function: NDHWC float32 windows (B, w, w, w, N_in) -> (B, w, w, w, N_out) float32.
Apply = Callable[[np.ndarray], np.ndarray]


# --- geometry --------------------------------------------------------------------------------


def alignment(cfg: Config) -> int:
    """``2**levels``: every side the network takes, and every window origin, is a multiple of it."""
    return 2 ** len(unet_spec.encoder_widths(cfg))


def padded_side(size: int, align: int) -> int:
    """``size`` rounded up to a multiple of ``align``."""
    return -(-size // align) * align


def min_window(overlap: int, align: int) -> int:
    """The smallest window side (a multiple of ``align``) with which :func:`axis_plan` always makes
    progress: ``window >= 2 overlap + align`` (a window origin rounds down by up to ``align - 1``)."""
    return padded_side(2 * overlap + align, align)


def axis_plan(size: int, window: int, overlap: int, align: int) -> list[tuple[int, int, int]]:
    """The windows along one axis of a (padded) side ``size``: ``(start, lo, hi)`` per window, the
    window covering ``[start, start + window)`` and giving the output voxels ``[lo, hi)``.

    The ``[lo, hi)`` partition ``[0, size)``. Each ``start`` is a multiple of ``align`` and lies at
    least ``overlap`` below ``lo`` unless it is 0; each window ends at least ``overlap`` above ``hi``
    unless it ends at ``size``. ``window >= size`` gives one window, the whole side.

    Raises:
        ValueError: ``size`` or ``window`` is not a multiple of ``align``, or ``window`` is below
            :func:`min_window` and less than ``size``.
    """
    if size % align or window % align:
        raise ValueError(f"size {size} and window {window} must be multiples of {align}")
    if window >= size:
        return [(0, 0, size)]
    if window < min_window(overlap, align):
        raise ValueError(f"window {window} is below the smallest {min_window(overlap, align)} for overlap {overlap}")
    plan, lo = [], 0
    while lo < size:
        start = min(max((lo - overlap) // align * align, 0), size - window)
        hi = size if start + window == size else start + window - overlap
        plan.append((start, lo, hi))
        lo = hi
    return plan


@dataclasses.dataclass(frozen=True)
class Tile:
    """One window of a 3-D plan: origin ``start`` (voxels, x y z), output box ``[lo, hi)`` per axis."""

    start: tuple[int, int, int]
    lo: tuple[int, int, int]
    hi: tuple[int, int, int]


def tile_plan(size: int, window: int, overlap: int, align: int) -> list[Tile]:
    """The 3-D plan of a cubic (padded) side: the product of :func:`axis_plan` over x, y, z."""
    axis = axis_plan(size, window, overlap, align)
    return [Tile(*zip(*parts)) for parts in itertools.product(axis, axis, axis)]


def activation_bytes(cfg: Config, side: int, batch: int = 1, precision: str = "float32") -> int:
    """Estimated device memory of a forward pass of ``batch`` windows of ``side``^3: the input
    (float32) plus, in the compute type, twice every conv layer's output (its intermediates, the
    decoder's concatenations), as if all were alive at once. An upper-side estimate for choosing
    a tile size, not a measurement."""
    item = 2 if precision == "bfloat16" else 4
    acts = sum(2 * s.out_size**3 * s.c_out for s in unet_spec.layer_specs(cfg, side))
    return batch * (4 * side**3 * cfg.N_in_channels + item * acts)


def choose_window(cfg: Config, side: int, tile: int | None, overlap: int, precision: str, memory_gb: float) -> int:
    """The window side for a padded volume side ``side``: ``tile`` when given (0 or >= ``side``: the
    whole volume), else the whole volume if :func:`activation_bytes` fits in ``memory_gb``, else the
    largest window that fits.

    Raises:
        ConfigError: ``tile`` is not a multiple of the alignment or is too small for ``overlap``;
            no window fits in ``memory_gb``.
    """
    align = alignment(cfg)
    smallest = min_window(overlap, align)
    if tile is not None:
        if tile == 0 or tile >= side:
            return side
        if tile % align or tile < smallest:
            raise ConfigError(
                f"--tile {tile}: a tile side must be a multiple of 2**levels = {align} and at least "
                f"{smallest} (2 x overlap {overlap} + {align}, rounded up), or 0 for the whole volume"
            )
        return tile
    budget = memory_gb * 2**30
    if activation_bytes(cfg, side, 1, precision) <= budget:
        return side
    for window in range(side - align, smallest - 1, -align):
        if activation_bytes(cfg, window, 1, precision) <= budget:
            return window
    need = activation_bytes(cfg, min(smallest, side), 1, precision) / 2**30
    raise ConfigError(
        f"--memory_gb {memory_gb:g}: even the smallest seamless tile ({smallest}^3, overlap {overlap}) needs "
        f"~{need:.1f} GiB; raise --memory_gb or give --tile and a smaller --overlap (seams)"
    )


# --- reading, stitching, writing --------------------------------------------------------------


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


def predict_volume(
    x: np.ndarray,
    apply: Apply,
    n_out: int,
    window: int,
    overlap: int,
    align: int,
    batch_size: int = 1,
    progress: bool = False,
) -> tuple[np.ndarray, int]:
    """Predict a (padded) volume ``x`` (L, L, L, N_in) float32 with ``apply``, window by window of
    :func:`tile_plan`, batches of ``batch_size`` windows (the last one padded with zeros, so every
    call has one shape); return the stitched (L, L, L, n_out) float32 and the number of windows.
    ``progress``: a progress bar over the batches of windows on a terminal (none in a log)."""
    size = x.shape[0]
    plan = tile_plan(size, min(window, size), overlap, align)
    w = min(window, size)
    out = np.empty((size, size, size, n_out), np.float32)
    starts = range(0, len(plan), batch_size)
    for i in progress_bar(starts, len(starts), f"{len(plan)} windows, batches of {batch_size}", progress):
        tiles = plan[i : i + batch_size]
        batch = np.zeros((batch_size, w, w, w, x.shape[-1]), np.float32)
        for b, t in enumerate(tiles):
            batch[b] = x[tuple(slice(s, s + w) for s in t.start)]
        y = np.asarray(apply(batch), np.float32)
        for b, t in enumerate(tiles):
            src = tuple(slice(lo - s, hi - s) for s, lo, hi in zip(t.start, t.lo, t.hi))
            out[tuple(slice(lo, hi) for lo, hi in zip(t.lo, t.hi))] = y[b][src]
    return out, len(plan)


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


# --- weights and configs ------------------------------------------------------------------------


def prediction_config(cfg: Config, precision: str) -> Config:
    """``cfg`` computing in ``precision`` (``float32`` or ``bfloat16``), nothing trained."""
    return config_mod.replace(
        cfg,
        enable_amp=precision != "float32",
        amp_dtype="bfloat16" if precision == "bfloat16" else cfg.amp_dtype,
        grad_allreduce_dtype="float32",
    )


def checkpoint_dir(workdir: str | Path) -> Path:
    """``<workdir>/checkpoints``.

    Raises:
        UserError: ``workdir`` or its ``checkpoints`` folder does not exist.
    """
    directory = Path(workdir) / "checkpoints"
    if not directory.is_dir():
        raise UserError(f"--workdir {workdir}: no checkpoints folder {directory} (a run folder of the trainer?)")
    return directory


def checkpoint_config(cfg: Config, workdir: str | Path) -> Config:
    """The config a run in ``workdir`` trained with (its ``run.json``), which decides the structure of
    its checkpoints (optimizer state, fp16 loss scale); ``cfg`` itself when there is no ``run.json``.

    Raises:
        ConfigError: the run's model keys (:data:`MODEL_KEYS`) differ from ``cfg``'s.
    """
    from shared_data.runtime.records import read_run_info

    values = read_run_info(Path(workdir)).get("config_values")
    if not isinstance(values, dict):
        return cfg
    # a key the run's config lacks (added to the kit after the run) takes ``cfg``'s value
    run_cfg = config_checks.make_config({**config_mod.config_dict(cfg), **values}, cfg.name, f"{workdir}/run.json")
    for key in MODEL_KEYS:
        if getattr(run_cfg, key) != getattr(cfg, key):
            raise ConfigError(
                f"--workdir {workdir} was trained with {key} = {getattr(run_cfg, key)!r}, config "
                f"{cfg.name!r} has {getattr(cfg, key)!r}: pass the run's --config"
            )
    return run_cfg


def latest_checkpoint(checkpoints, workdir: str | Path) -> int:
    """The newest epoch of a framework's ``Checkpoints`` (``epochs()``).

    Raises:
        UserError: there is none.
    """
    epochs = checkpoints.epochs()
    if not epochs:
        raise UserError(f"--workdir {workdir}: no checkpoint in {checkpoint_dir(workdir)}")
    return epochs[-1]


Restore = Callable[[Config, Path, str], tuple[dict[str, np.ndarray], int]]


def load_weights(
    cfg: Config, weights: str | None, workdir: str | None, restore: Restore
) -> tuple[dict[str, np.ndarray], str]:
    """Canonical weights from the ``.npz`` file ``weights``, or those the run in ``workdir`` evaluated
    (:func:`run_weights`: with ``ema_decay`` the weight average, which its checkpoints do not hold),
    else its latest checkpoint through a framework's ``restore(run_cfg, checkpoints_folder, workdir) ->
    (canonical weights, epoch)``; and their description, naming which.

    Raises:
        UserError: a missing or mismatched weights file, no checkpoint, a checkpoint of another config,
            weights holding NaN or inf (:func:`shared_data.model.unet_spec.check_finite_weights`).
    """
    if weights:
        return unet_spec.load_weights(weights, cfg), describe_weights(weights, None)
    directory = checkpoint_dir(workdir)
    run_cfg = checkpoint_config(cfg, workdir)
    evaluated = run_weights(workdir)
    if evaluated is not None:
        what = "the weight average it evaluated" if run_cfg.ema_decay else "its final weights"
        return unet_spec.load_weights(evaluated, cfg), f"the run's {evaluated.absolute()} ({what})"
    canonical, epoch = restore(run_cfg, directory, workdir)
    if run_cfg.ema_decay:
        log.warning(
            "the run in %s evaluated a weight average (ema_decay %g) and left no current weights.npz: its "
            "checkpoint holds the trained weights, not that average",
            workdir,
            run_cfg.ema_decay,
        )
    unet_spec.check_finite_weights(canonical, f"the checkpoint of epoch {epoch} in {directory}")
    return canonical, describe_weights(None, workdir, epoch)


def run_weights(workdir: str | Path) -> Path | None:
    """``<workdir>/weights.npz`` when the run's end wrote it after its newest checkpoint (the weights
    the run evaluated: the trainer writes them there at its end for a run with a weight average or a
    quality target, or with ``--save_weights`` into the run folder), else None."""
    path = Path(workdir) / "weights.npz"
    if not path.is_file():
        return None
    saved = [f.stat().st_mtime for f in (Path(workdir) / "checkpoints").rglob("*") if f.is_file()]
    return path if not saved or max(saved) <= path.stat().st_mtime else None


# --- the command line ----------------------------------------------------------------------------


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


def add_weights_args(parser: argparse.ArgumentParser) -> None:
    """``--weights`` (a canonical ``.npz``) or ``--workdir`` (a run folder: :func:`load_weights`), one required."""
    g = parser.add_argument_group("weights").add_mutually_exclusive_group(required=True)
    g.add_argument("--weights", help="canonical weights file (.npz), e.g. the trainer's --save_weights")
    g.add_argument(
        "--workdir",
        help="a training run folder: the weights it evaluated (its weights.npz, written at the run's end), "
        "else its latest checkpoint",
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
        default=DEFAULT_MEMORY_GB,
        help="activation budget that picks whole-volume vs tiles when --tile is not given (default: %(default)s)",
    )
    g.add_argument("--validate", metavar="DIR", help="then validate against the input's Hydro into DIR")
    return p


def weights_inputs(args: argparse.Namespace) -> dict[str, str | Path | None]:
    """The files ``predict`` and ``export`` read their weights from: ``--weights``, or the run
    folder's ``run.json``, ``checkpoints`` and ``weights.npz`` of ``--workdir``."""
    if args.weights:
        return {"--weights": args.weights}
    return {f"--workdir's {name}": Path(args.workdir) / name for name in ("run.json", "checkpoints", "weights.npz")}


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
    make_apply: Callable[[Config, dict], Apply],
    versions: Callable[[], dict],
) -> int:
    """The ``predict`` command of both frameworks: parse, load the weights (``load_weights(cfg,
    weights, workdir) -> (canonical weights, description)``), plan, predict with
    ``make_apply(cfg, weights)``, write ``--out`` and, with ``--validate``, the validation report."""
    args = build_parser(framework).parse_args(argv)
    setup_logging()
    cfg = prediction_config(config_from_args(args), args.precision)
    align, margin = alignment(cfg), unet_spec.receptive_margin(cfg)
    check_args(args, margin)
    overlap = margin if args.overlap is None else args.overlap
    x, attrs = read_input(args.input, cfg.N_in_channels)
    side = x.shape[0]
    size = padded_side(side, align)
    window = choose_window(cfg, size, args.tile, overlap, args.precision, args.memory_gb)
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
    hydro, tiles = predict_volume(
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
    if "Nbody_crc32" in attrs:  # identifies the input wherever it is moved (validate compares it)
        provenance["prediction_input_Nbody_crc32"] = attrs["Nbody_crc32"]
    write_prediction(args.out, hydro, {**attrs, **provenance})
    log.info("wrote %s: Hydro (%d, %d, %d, %d) float32", args.out, cfg.N_out_channels, side, side, side)
    if args.validate:
        from shared_data.inference import validate

        validate.validate_files(args.out, args.input, args.validate)
    return 0


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


def describe_weights(weights: str | None, workdir: str | None, epoch: int | None = None) -> str:
    """The one-phrase description of where weights come from, as logged and recorded."""
    if weights:
        return f"weights {Path(weights).absolute()}"
    return f"checkpoint {Path(workdir).absolute() / 'checkpoints'} epoch {epoch}"
