"""Validate a predicted volume against its truth: the numbers a cosmologist reads, as JSON and a figure.

    python -m shared_data.inference.validate --pred pred.h5 --truth data/val_128.h5 --out DIR
    python -m jax_impl.predict ... --input data/val_128.h5 --out pred.h5 --validate DIR   # weights + a volume

Inputs: ``--pred`` holds ``Hydro`` (N_out, L, L, L) float32 (what ``predict`` writes); ``--truth`` is a
file of the dataset contract with ``Nbody`` and ``Hydro`` of the same side. Values are stored
(transformed) units; the transforms, the voxel size and the channel names come from the files'
attributes or from the flags that give them (``--voxel_size``, ``--density_scale``, ...), a flag
winning over an attribute (:mod:`shared_data.inference.units`). A prediction is scored only against
the volume it was predicted from (:func:`check_prediction_input`).

Writes, both atomically:

* ``DIR/validation.json``: the metrics of :mod:`shared_data.inference.metrics` (L1, P(k), r(k) and
  the PDFs of the model and of both baselines), with the prediction's provenance;
* ``DIR/validation.png``: the figure of :mod:`shared_data.inference.figures`, the framework, weights
  and precision (the prediction's ``prediction_*`` attributes) in its title.

This module owns the command: reading and checking both files, the report's files and its log lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core.commands import make_parser
from shared_data.core.errors import DatasetError, UserError, run_cli
from shared_data.core.files import check_not_input, one_set_or_none, write_atomic, writing
from shared_data.data import dataset
from shared_data.inference.figures import figure
from shared_data.inference.metrics import compute_metrics, to_json
from shared_data.inference.units import QUANTITIES, read_volume, units_from_files

log = logging.getLogger("dlas.validate")

STEM = "validation"  # DIR/validation.json, DIR/validation.png


# --- the prediction's provenance ------------------------------------------------------------------


def short_path(path: str) -> str:
    """An absolute ``path`` as a title shows it: relative to the current folder when inside it, else
    ``.../`` and its last three parts (a title names the run, not the machine's folders)."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else ".../" + "/".join(p.parts[-3:])


def provenance(attrs: dict) -> str:
    """The prediction's framework, weights and precision (``prediction_*`` attributes) in a phrase."""
    if "prediction_framework" not in attrs:
        return "prediction (no prediction_* attributes: framework and weights unknown)"
    fw = {"jax": "JAX", "tf": "TensorFlow"}.get(attrs["prediction_framework"], attrs["prediction_framework"])
    weights = re.sub(r"/\S+", lambda m: short_path(m.group()), str(attrs.get("prediction_weights", "weights unknown")))
    config, precision = attrs.get("prediction_config", "?"), attrs.get("prediction_precision", "?")
    return f"{fw} prediction, {weights}, config {config}, {precision}"


# --- driver ------------------------------------------------------------------------------------------


def check_prediction_input(
    pred_path: Path, pred_attrs: dict, truth_path: Path, truth_attrs: dict, nbody: np.ndarray
) -> None:
    """Refuse to score a prediction against a volume other than the one it was predicted from: the
    Nbody checksums it records (``prediction_input_Nbody_crc32``) must be the truth file's (its
    ``Nbody_crc32`` attribute, else computed from its ``nbody`` values). A prediction that records
    none (not written by ``predict``) is scored with one warning that says it cannot be checked.

    Raises:
        DatasetError: the checksums differ (the message names the recorded input).
    """
    if pred_attrs.get("prediction_input_Nbody_crc32") is None:
        log.warning(
            "%s records no checksum of the volume it was predicted from (prediction_input_Nbody_crc32): "
            "that it was predicted from %s cannot be checked",
            pred_path,
            truth_path,
        )
        return
    made_from = dataset.json_attr(pred_attrs, "prediction_input_Nbody_crc32", pred_path)
    if truth_attrs.get("Nbody_crc32") is not None:
        truth_crc = dataset.json_attr(truth_attrs, "Nbody_crc32", truth_path)
    else:
        truth_crc = dataset.channel_crc32(nbody)
    if made_from != truth_crc:
        raise DatasetError(
            f"{pred_path} was predicted from {pred_attrs.get('prediction_input', 'another volume')}, whose Nbody "
            f"checksums differ from {truth_path}'s; validate it against the volume it was predicted from"
        )


def report_files(out_dir: str | Path, stem: str = STEM, plot: bool = True) -> list[Path]:
    """The files :func:`validate_files` writes in ``out_dir``: ``<stem>.json`` and, with ``plot``, ``<stem>.png``."""
    return [Path(out_dir) / f"{stem}.{ext}" for ext in ("json", "png")[: 1 + plot]]


def validate_files(
    pred_path,
    truth_path,
    out_dir,
    flags: dict | None = None,
    z: int | None = None,
    stem: str = STEM,
    plot: bool = True,
) -> dict:
    """Compute the metrics of ``pred_path`` against ``truth_path``, write ``<stem>.json`` and (if
    ``plot``) ``<stem>.png`` into ``out_dir`` (created) and return the metrics (JSON form); ``flags``
    give quantities of :data:`~shared_data.inference.units.QUANTITIES` (None: from the attributes),
    ``z`` the slice shown.

    Raises:
        DatasetError: the prediction was made from another volume, a file breaks its layout, the
            sides or channel counts differ, a needed
            attribute is missing (the message names the flag) or two files disagree on it.
        UserError: a report file is the prediction or the truth file (:func:`report_files`).
    """
    pred_path, truth_path, out_dir = Path(pred_path), Path(truth_path), Path(out_dir)
    outputs = {f"--out's {p.name}": p for p in report_files(out_dir, stem, plot)}
    check_not_input(outputs, {"--pred": pred_path, "--truth": truth_path}, "report")
    pred, pred_attrs = read_volume(pred_path, "Hydro")
    truth, truth_attrs = read_volume(truth_path, "Hydro")
    nbody, _ = read_volume(truth_path, "Nbody")
    if pred.shape != truth.shape:
        raise DatasetError(f"{pred_path}: Hydro {pred.shape} differs from the truth's {truth.shape} in {truth_path}")
    if nbody.shape[1:] != truth.shape[1:]:
        raise DatasetError(f"{truth_path}: Nbody {nbody.shape} and Hydro {truth.shape} differ in side")
    check_prediction_input(pred_path, pred_attrs, truth_path, truth_attrs, nbody)
    for path, volume in ((pred_path, pred), (truth_path, truth)):
        worst = float(np.nanmax(np.abs(volume))) if volume.size else 0.0
        if worst > 1.0:  # the model's output is tanh's: a file beyond it is no prediction of this kit's model
            log.warning(
                "%s: Hydro holds %s, beyond [-1, 1], the range of the model's output (tanh): "
                "its metrics describe this file, not a model of this kit",
                path,
                f"{worst:.4g}",
            )
    side = truth.shape[1]
    units = units_from_files({truth_path: truth_attrs, pred_path: pred_attrs}, side, flags or {})
    if len(units.hydro_channels) != truth.shape[0] or len(units.nbody_channels) != nbody.shape[0]:
        raise DatasetError(
            f"channel names {list(units.hydro_channels)} / {list(units.nbody_channels)} do not match Hydro "
            f"{truth.shape[0]} / Nbody {nbody.shape[0]} channels of {truth_path}"
        )
    z = side // 2 if z is None else z
    if not 0 <= z < side:
        raise UserError(f"--slice {z}: expected an index in [0, {side})")
    metrics = compute_metrics(pred, truth, nbody, units)
    what = provenance(pred_attrs)
    metrics = {"prediction": str(pred_path.absolute()), "truth": str(truth_path.absolute()), "what": what, **metrics}
    metrics["prediction_attributes"] = {
        k: dataset.json_attr(pred_attrs, k, pred_path) if isinstance(v, str) and v[:1] in ("[", "{") else v
        for k, v in pred_attrs.items()
        if k.startswith("prediction_")
    }
    record = to_json(metrics)
    title = (
        f"{what}\nvs {truth_path.name} ({side}^3, {units.voxel_size:g} Mpc/h voxels): "
        f"mean L1 {record['l1_mean']['model']:.4f} (stored units)"
    )
    draw = (lambda path: figure(path, pred, truth, record, units, title, z)) if plot else (lambda path: None)
    write_report(out_dir, stem, record, draw)
    log_summary(record)
    log.info("wrote %s", ", ".join(map(str, report_files(out_dir, stem, plot))))
    return record


def write_report(out_dir: Path, stem: str, record: dict, draw) -> None:
    """Write ``<stem>.png`` (``draw(path)``; a ``draw`` that writes nothing: no figure) and then
    ``<stem>.json`` into ``out_dir`` (made if missing), each atomically. A failed write (a full disk)
    leaves no part of a new report and no folder that this call made (:func:`one_set_or_none`).

    Raises:
        UserError: ``cannot write <file> (<reason>)``.
    """
    png, report = out_dir / f"{stem}.png", out_dir / f"{stem}.json"
    with one_set_or_none(out_dir, [png, report]):
        with writing(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
        for path, write in ((png, draw), (report, lambda p: write_atomic(p, json.dumps(record, indent=1)))):
            with writing(path):
                write(path)


def log_summary(record: dict) -> None:
    """One line per channel (L1 model vs both baselines) and per spectrum (mean r, mean ratio, k where r < 0.9)."""
    for name, v in record["l1"].items():
        base = "no baseline" if v["baseline"] is None else f"baseline {v['baseline']:.5f}"
        non_ml = "no non-ML baseline" if v.get("non_ml") is None else f"non-ML {v['non_ml']:.5f}"
        log.info("L1 %-16s model %.5f, %s, %s", name, v["model"], base, non_ml)
    for name, s in record["power"].items():
        for tag, summary in s["summary"].items():
            k90, r_mean = summary["k_r_below_0.9"], summary["r_mean"]
            if r_mean is None or not np.isfinite(r_mean):  # a field without fluctuations has no r(k)
                where = "undefined (a field without fluctuations, e.g. a constant, has no r(k))"
            else:
                where = "never" if k90 is None else f"{k90:.3g} h/Mpc"
            log.info(
                "P(k) %-16s %-8s mean r %.3f, mean P ratio %.3f, r < 0.9 from k = %s",
                name,
                tag,
                r_mean if r_mean is not None else float("nan"),
                summary["ratio_mean"] if summary["ratio_mean"] is not None else float("nan"),
                where,
            )


def build_parser() -> argparse.ArgumentParser:
    """The ``validate`` flags: the two files, the output folder, the slice shown, and the units that a
    file's attributes may lack (:data:`~shared_data.inference.units.QUANTITIES`)."""
    p = make_parser("shared_data.inference.validate", __doc__.split("\n\n")[0])
    p.add_argument("--pred", required=True, help="prediction file (Hydro (N_out, L, L, L), e.g. from predict)")
    p.add_argument("--truth", required=True, help="truth file of the dataset contract (Nbody and Hydro)")
    p.add_argument("--out", required=True, help="folder for validation.json and validation.png")
    p.add_argument("--slice", type=int, help="index of the z slice shown (default: L // 2)")
    g = p.add_argument_group("units (for files without the attributes; a flag wins over an attribute)")
    g.add_argument("--voxel_size", type=float, help="voxel side in Mpc/h")
    g.add_argument("--density_scale", type=float, help="rho / <rho> = exp(s x)")
    g.add_argument("--temperature_scale", type=float, help="T = T0 exp(s x)")
    g.add_argument("--T0", dest="temperature_T0", type=float, help="T0 in K of the temperature transform")
    g.add_argument("--velocity_scale", type=float, help="km/s per stored velocity unit")
    g.add_argument("--igm_gamma", type=float, help="gamma of the IGM relation (temperature baselines)")
    g.add_argument("--k_jeans", type=float, help="k_J in h/Mpc of the non-ML baseline's Jeans filter")
    g.add_argument("--hydro_channels", help="comma-separated Hydro channel names (gas_density, gas_temperature, ...)")
    g.add_argument("--nbody_channels", help="comma-separated Nbody channel names (dm_density, dm_vx, ...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m shared_data.inference.validate``: parse ``argv``, then :func:`validate_files`; 0 when
    the report is written.

    Raises:
        UserError: ``--out`` is a file; and what :func:`validate_files` raises.
    """
    from shared_data.runtime.logs import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging()
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a file, expected a folder")
    flags = {name: getattr(args, name) for name in QUANTITIES}
    validate_files(args.pred, args.truth, args.out, flags, args.slice)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
