"""The table of this study's runs: ``python experiments/time_to_quality/table.py OUT [--plot curve.png]``.

Reads every ``OUT/<run>/quality.jsonl`` (one line per evaluation, :mod:`shared_data.inference.quality`)
and ``OUT/<run>/run.json`` and prints, per run, the metrics of its last evaluation (worst bin up to
k_max: gas density r and |P ratio - 1|, temperature r, |P ratio - 1| and r minus the baseline's r,
the smallest r minus the non-ML baseline's r of both channels where the target tested it),
the time from the start, the best shortfall and when it was reached, and the time to quality when the
target was met. ``--plot`` draws the shortfall (<= 0: target met) of every run against time;
``--spectra`` draws, per run, the binned P_pred/P_true and r(k) of the evaluation that met the target
(or of the best one) against the target's band and floor. After the table: the median time to
quality of the runs that met the target, and each epoch's wall time in parts (steps, validation,
checkpoint and quality check on the training path, the rest) where the runs' ``metrics.jsonl`` hold
them. A record that cannot be read (a damaged run.json, a field missing or of the wrong type, a binary
file) or a figure that cannot be written is one ``error:`` line naming the file; a torn last line of a
``quality.jsonl`` (what a killed trainer leaves) is skipped with a warning.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
from pathlib import Path

from shared_data.core.errors import UserError, quoted, run_cli
from shared_data.core.files import atomic_path, check_writable, writing
from shared_data.inference import quality
from shared_data.runtime.records import read_metrics, run_info_and_problem

DENSITY, TEMPERATURE = "gas_density", "gas_temperature"
#: What the table reads of each evaluation besides :func:`quality.evaluation_problem`'s fields, and of
#: each channel's entry.
EVALUATION_KEYS = ("met", "shortfall")
CHANNEL_KEYS = ("r_worst", "ratio_dev_worst", "r_minus_baseline_worst")
#: The parts of an epoch's wall time that :func:`parts_table` prints from ``metrics.jsonl``.
PARTS = ("wall_sec", "epoch_sec", "val_sec", "other_sec")


def runs(out: Path) -> dict[str, tuple[list[dict], dict]]:
    """Run name -> (its evaluations, its run.json's ``time_to_quality``), runs with evaluations only,
    read with the trainer's readers (:func:`quality.read_evaluations`, :func:`run_info_and_problem`).

    Raises:
        UserError: a record that cannot be read or lacks what the table shows (file and field named).
    """
    found = {}
    for path in sorted(out.glob("*/quality.jsonl")):
        curve = quality.read_evaluations(path.parent)
        for evaluation in curve:
            _check_evaluation(path, evaluation)
        if curve:
            found[path.parent.name] = (curve, time_to_quality(path.parent))
    return found


def _check_evaluation(path: Path, evaluation: dict) -> None:
    where = f"{path}: the evaluation of epoch {evaluation['epoch']}"
    for key in EVALUATION_KEYS:
        if key not in evaluation:
            raise UserError(f"{where} has no {key!r}")
    for name in (DENSITY, TEMPERATURE):
        missing = [key for key in CHANNEL_KEYS if key not in evaluation["channels"][name]]
        if missing:
            raise UserError(f"{where}: {name} has no {missing[0]!r}")


def time_to_quality(run: Path) -> dict:
    """The ``time_to_quality`` of ``run``'s run.json ({} without the file or the key).

    Raises:
        UserError: run.json cannot be used, or its times are not numbers (or null, not met).
    """
    info, problem = run_info_and_problem(run)
    path = run / "run.json"
    if problem:
        raise UserError(f"{path} {problem}")
    ttq = info.get("time_to_quality", {})
    if not isinstance(ttq, dict):
        raise UserError(f"{path}: time_to_quality is {quoted(ttq, 60)}, expected an object")
    for key in ("time_to_quality_sec", "train_sec_to_quality"):
        value = ttq.get(key)
        if value is not None and not _is_seconds(value):
            raise UserError(f"{path}: time_to_quality's {key} is {quoted(value, 60)}, expected seconds or null")
    if ttq.get("time_to_quality_sec") is not None and ttq.get("train_sec_to_quality") is None:
        raise UserError(f"{path}: time_to_quality has a time_to_quality_sec and no train_sec_to_quality")
    if ttq.get("target") is not None and not isinstance(ttq["target"], dict):
        raise UserError(f"{path}: time_to_quality's target is {quoted(ttq['target'], 60)}, expected an object")
    return ttq


def _is_seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def table(found: dict) -> str:
    head = (
        "| run | epochs | time s | rho r | rho abs(P-1) | T r | T abs(P-1) | T r - base | r - non-ML | shortfall "
        "| best (at s) | time to quality s |"
    )
    lines = [head, "|" + "---|" * 12]
    for name, (curve, info) in found.items():
        last = curve[-1]
        rho, t = last["channels"][DENSITY], last["channels"][TEMPERATURE]
        best = lowest_shortfall(curve)
        base = t["r_minus_baseline_worst"]
        non_ml = [c.get("r_minus_non_ml_worst") for c in (rho, t) if c.get("r_minus_non_ml_worst") is not None]
        ttq = info.get("time_to_quality_sec")
        lines.append(
            f"| {name} | {last['epoch']} | {last['time_sec']:.0f} "
            f"| {_f4(rho['r_worst'])} | {_f4(rho['ratio_dev_worst'])} "
            f"| {_f4(t['r_worst'])} | {_f4(t['ratio_dev_worst'])} | {'-' if base is None else f'{base:+.4f}'} "
            f"| {f'{min(non_ml):+.4f}' if non_ml else '-'} "
            f"| {_num(last['shortfall'])} | {_num(best['shortfall'])} ({best['time_sec']:.0f}) "
            f"| {'not met' if ttq is None else f'{ttq:.0f}'} |"
        )
    return "\n".join(lines)


def median_line(found: dict) -> str:
    """The median time to quality (and without the evaluations) over the runs that met the target, with
    how many did; "" where none did."""
    met = [info for _, info in found.values() if info.get("time_to_quality_sec") is not None]
    if not met:
        return ""
    ttq = statistics.median(i["time_to_quality_sec"] for i in met)
    train = statistics.median(i["train_sec_to_quality"] for i in met)
    return (
        f"median time to quality {ttq:.1f} s ({train:.1f} s without the evaluations), "
        f"{len(met)} of {len(found)} runs met"
    )


def parts_table(out: Path, found: dict) -> str:
    """Per run and epoch, the epoch's wall time on the training path and its parts, from the run's
    ``metrics.jsonl`` (records that have them: ``wall_sec``); "" where none has."""
    lines = [
        "| run | epoch | wall s | steps s | validation s | checkpoint s | quality check s | other s |",
        "|" + "---|" * 8,
    ]
    for name in found:
        for r in read_metrics(out / name):  # the trainer's reader: a torn line is skipped with a warning
            if "wall_sec" in r:
                _check_parts(out / name / "metrics.jsonl", r)
                lines.append(
                    f"| {name} | {r['epoch']} | {r['wall_sec']:.2f} | {r['epoch_sec']:.2f} | {r['val_sec']:.2f} "
                    f"| {r.get('checkpoint_sec', 0.0):.2f} | {r.get('quality_check_sec', 0.0):.2f} "
                    f"| {r['other_sec']:.2f} |"
                )
    return "\n".join(lines) if len(lines) > 2 else ""


def _check_parts(path: Path, record: dict) -> None:
    """Raise a :class:`UserError` naming ``path``, the epoch and the field where an epoch's part is not
    a number of seconds (the checkpoint and quality check's may be absent)."""
    for key in (*PARTS, "checkpoint_sec", "quality_check_sec"):
        if (key in PARTS or key in record) and not _is_seconds(record.get(key)):
            what = "no" if key not in record else quoted(record[key], 60)
            raise UserError(f"{path}: the record of epoch {record['epoch']} has {what} {key}, expected seconds")


def _f4(x) -> str:
    """Four decimals; "nan" for null (the records hold null for a non-finite value)."""
    return "nan" if x is None else f"{x:.4f}"


def _num(x) -> str:
    return "inf" if x is None else f"{x:.3g}"


def plot(found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (curve, _) in found.items():
        pts = [(c["time_sec"], c["shortfall"]) for c in curve if c["shortfall"] is not None]
        if pts:
            ax.plot(*zip(*pts), "-o", ms=3, label=name)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xlabel("seconds from the start of the run")
    ax.set_ylabel("shortfall (<= 0: target met)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


def lowest_shortfall(curve: list[dict]) -> dict:
    """The evaluation with the lowest shortfall (a None shortfall, a non-finite metric, counts as inf)."""
    return min(curve, key=lambda c: c["shortfall"] if c["shortfall"] is not None else float("inf"))


def shown(curve: list[dict]) -> dict:
    """The evaluation ``--spectra`` draws: the first that met the target, else the lowest shortfall."""
    met = [c for c in curve if c["met"]]
    return met[0] if met else lowest_shortfall(curve)


def thresholds(evaluation: dict, channel: str, fallback: dict | None = None) -> tuple[float, float]:
    """(r_min, ratio_tol) that ``evaluation`` judged ``channel`` against: its record's ``target`` (the
    temperature's own where set); for a record without one, ``fallback`` (the run's target in its
    run.json), else 0.998 and 0.02, config ``quality``'s."""
    t = evaluation.get("target") or fallback or {}
    r_min, tol = t.get("r_min", 0.998), t.get("ratio_tol", 0.02)
    if channel == TEMPERATURE:
        r_min = r_min if t.get("temperature_r_min") is None else t["temperature_r_min"]
        tol = tol if t.get("temperature_ratio_tol") is None else t["temperature_ratio_tol"]
    return r_min, tol


def spectra(found: dict):
    """The figure of ``--spectra``: one row per run, P_pred/P_true (left, the band 1 +- ratio_tol
    shaded) and r(k) (right, the floor r_min dashed, the dark-matter baseline dotted and the non-ML
    baseline dash-dotted where recorded) of gas density and temperature in the bins the target tests
    (k in h/Mpc), for the evaluation :func:`shown` picks, with the thresholds it was judged against
    (:func:`thresholds`: one grey band and one black floor when both channels share them, else one of
    each in the channel's colour). Returns the matplotlib Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 2.8 * len(found)))
    axes = fig.subplots(len(found), 2, squeeze=False)
    colors = {DENSITY: "C0", TEMPERATURE: "C3"}
    for (name, (curve, info)), (left, right) in zip(found.items(), axes):
        ev = shown(curve)
        limits = {channel: thresholds(ev, channel, info.get("target")) for channel in ev["channels"]}
        shared = len(set(limits.values())) == 1
        for channel, (r_min, tol) in list(limits.items())[: 1 if shared else None]:
            band, floor = ("0.88", "k") if shared else (colors[channel], colors[channel])
            prefix = "" if shared else f"{channel} "
            alpha = 1.0 if shared else 0.15
            left.axhspan(1 - tol, 1 + tol, color=band, alpha=alpha, zorder=0, label=f"{prefix}1 ± {tol:g}")
            right.axhline(r_min, color=floor, ls="--", lw=0.8, label=f"{prefix}r = {r_min:g}")
        for channel, s in ev["channels"].items():
            left.plot(s["k"], s["ratio"], "-o", ms=3, color=colors[channel], label=channel)
            right.plot(s["k"], s["r"], "-o", ms=3, color=colors[channel], label=f"{channel} model")
            if s.get("r_baseline") is not None:
                right.plot(s["k"], s["r_baseline"], ":", color=colors[channel], label=f"{channel} baseline")
            if s.get("r_non_ml") is not None:
                right.plot(s["k"], s["r_non_ml"], "-.", color=colors[channel], lw=0.8, label=f"{channel} non-ML")
        state = "target met" if ev["met"] else f"best, shortfall {_num(ev['shortfall'])}"
        left.set_title(f"{name}: epoch {ev['epoch']}, {ev['time_sec']:.0f} s, {state}", fontsize=9)
        left.set_ylabel("P_pred / P_true")
        right.set_ylabel("r(k)")
        for ax in (left, right):
            ax.set_xlabel("k [h/Mpc]")
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the recipe's $OUT (one folder per run)")
    p.add_argument("--plot", type=Path, help="write the shortfall curves here (PNG)")
    p.add_argument("--spectra", type=Path, help="write each run's P ratio and r(k) at its shown evaluation here (PNG)")
    args = p.parse_args(argv)
    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)  # stderr: stdout is the table
    for flag, path in (("--plot", args.plot), ("--spectra", args.spectra)):
        if path is not None:
            check_writable(path, flag)  # before the records are read
    found = runs(args.out)
    if not found:
        raise UserError(f"no run with a quality.jsonl under {args.out}")
    if args.plot:
        with writing(args.plot):
            plot(found, args.plot)
    if args.spectra:
        with writing(args.spectra), atomic_path(args.spectra, ".png") as tmp:
            spectra(found).savefig(tmp, dpi=90, format="png")
    text = "\n\n".join(t for t in (table(found), median_line(found), parts_table(args.out, found)) if t)
    print(text)  # once every record is read: a damaged one prints nothing but its error line
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
