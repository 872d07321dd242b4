"""The time-to-quality curve on the nonlinear gas: what the model reaches after given minutes, beside
both baselines.

    python experiments/nonlinear_gas/curve.py RECORDS --val data/val_128.h5 [--marks 1,2,5,10]

RECORDS holds one folder per run with its ``quality.jsonl`` (the trainer's evaluations of the whole
validation volume, :mod:`shared_data.inference.quality`). For each run and each mark (minutes from the
trainer's start) the last evaluation finished by then gives, for gas density and temperature, the worst
r(k) and the worst |P_pred/P_true - 1| over the k bins the target tests (k <= ``quality_k_max``, at least
one mode); a mark past the run's end stays empty, and a last row "end" gives the run's last evaluation.
The two baselines do not depend on the model: they are scored here on ``--val`` the way validate scores
them (:func:`shared_data.inference.metrics.compute_metrics` with the truth as the prediction): the
dark matter as gas, and the non-ML baseline (Jeans-filtered dark matter with the mean
temperature-density relation). Prints a markdown table; ``--json`` also writes it as records.

``--ceiling CEILING.json`` (from ``ceiling.py`` on the same volume) adds, per run, a table of every
k bin of its last evaluation: the model's r, the non-ML baseline's, the ceiling of r, the fraction of
the gap from the non-ML baseline to the ceiling that the model closes, (r - r_non_ml) /
(ceiling - r_non_ml), and the P ratio; then the smallest fraction per channel, the measure a target
relative to the ceiling would test.

``--config NAME`` judges every evaluation of each run again against that config's target (its
``quality_*`` keys, :class:`shared_data.inference.quality.Target`) from the bins the record holds, and
prints when the target is first met and in how many later evaluations it holds. ``--hold A,B`` prints,
per run, the thresholds every evaluation from the A-minute mark to the B-minute mark (``A,end``: to
the run's last evaluation) holds: per channel
the smallest worst-bin r rounded down to 0.01 and the largest worst-bin |P ratio - 1| rounded up to
0.01 (the rule that chose ``quality_nonlinear``'s thresholds). The model's worst bins are taken over
the bins each record holds (those its run's target tested) up to ``--k_max``. An error in one run's
``--config`` or ``--hold`` report is one line on stderr naming its file; the other runs are still
reported, and the exit status is 2.

The records are read with the trainer's reader (:func:`shared_data.inference.quality.read_evaluations`):
a torn last line is skipped with a warning, a record that lacks a field or holds one of the wrong type
is one error line naming its file. The baselines are those of ``--val``: a run whose ``run.json``
names another validation volume (its Nbody checksums differ from ``--val``'s, or, where that file is
not at hand, its k bins are not ``--val``'s) is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import write_atomic, writing
from shared_data.data import dataset
from shared_data.inference import quality
from shared_data.inference.metrics import compute_metrics
from shared_data.inference.units import DENSITY, TEMPERATURE, read_volume, units_from_files
from shared_data.runtime.records import run_info_and_problem

CHANNELS = {DENSITY: "rho", TEMPERATURE: "T"}


def worst(k, n, r, ratio, k_max: float) -> tuple[float, float]:
    """(min r, max |ratio - 1|) over the bins with centre k <= k_max and at least one mode."""
    k, n = np.asarray(k, np.float64), np.asarray(n)
    sel = (k <= k_max) & (n > 0)
    return float(np.min(np.asarray(r, np.float64)[sel])), float(np.max(np.abs(np.asarray(ratio, np.float64)[sel] - 1)))


def baselines(val: Path, k_max: float, curves: dict | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    """Baseline tag -> channel -> (worst r, worst |P ratio - 1|) on the volume ``val``; with ``curves``
    (each run's ``quality.jsonl`` path -> its evaluations), each run is checked to have been scored on
    ``val`` first (:func:`check_scored_on`)."""
    truth, attrs = read_volume(val, "Hydro")
    nbody, _ = read_volume(val, "Nbody")
    units = units_from_files({val: attrs}, truth.shape[1], {}, flags_given=False)
    metrics = compute_metrics(truth, truth, nbody, units)
    if curves:
        k = {name: metrics["power"][name]["k"] for name in CHANNELS}
        for path, curve in curves.items():
            check_scored_on(path.parent, curve[0], val, _crc32(val, attrs, nbody), k)
    out = {}
    for tag in ("baseline", "non_ml"):
        out[tag] = {}
        for name in CHANNELS:
            s = metrics["power"][name]
            if f"r_{tag}" in s:
                out[tag][name] = worst(s["k"], s["n_modes"], s[f"r_{tag}"], s[f"ratio_{tag}"], k_max)
    return out


def _crc32(path: Path, attrs: dict, nbody: np.ndarray) -> list[int]:
    """The Nbody checksums of the volume ``path``: its attribute where it has one, else computed."""
    if attrs.get("Nbody_crc32") is not None:
        return dataset.json_attr(attrs, "Nbody_crc32", path)
    return dataset.channel_crc32(nbody)


def check_scored_on(run: Path, evaluation: dict, val: Path, val_crc32: list[int], val_k: dict) -> None:
    """Refuse ``run`` when its ``run.json`` says it was scored on another volume than ``val``: the Nbody
    checksums its ``time_to_quality`` records of the volume differ from ``val``'s (``val_crc32``); for a
    run that records none, its ``val_path`` (relative to the folder it was started from) holds other
    Nbody values than ``val``, or, where that file is not at hand, the k bins of its ``evaluation`` are
    not ``val``'s (``val_k``: channel -> bin centres), and a warning says that only the bins were checked.
    A run without ``run.json`` (records written by hand) is not checked.

    Raises:
        UserError: naming the run's record, its volume and ``val``.
    """
    info, problem = run_info_and_problem(run)
    if problem:
        raise UserError(f"{run / 'run.json'} {problem}")
    ttq = info.get("time_to_quality")
    volume = ttq.get("volume") if isinstance(ttq, dict) else None
    if isinstance(volume, dict) and volume.get("Nbody_crc32") is not None:
        if volume["Nbody_crc32"] != val_crc32:
            raise UserError(
                f"{run / 'run.json'}: the run was scored on {volume.get('path', 'another volume')}, whose Nbody "
                f"checksums differ from --val {val}'s; pass the volume the run was scored on"
            )
        return
    values = info.get("config_values")
    if not isinstance(values, dict) or not isinstance(values.get("val_path"), str):
        return
    invocations = info.get("invocations") or [{}]
    cwd = invocations[-1].get("cwd") if isinstance(invocations[-1], dict) else None
    scored = Path(cwd or ".") / values["val_path"]
    if scored.is_file():
        if not Path(val).samefile(scored):
            nbody, attrs = read_volume(scored, "Nbody")
            if _crc32(scored, attrs, nbody) != val_crc32:
                raise UserError(
                    f"{run / 'run.json'}: the run was scored on {scored}, whose Nbody values differ from --val "
                    f"{val}'s; pass --val {scored}"
                )
        return
    for name in CHANNELS:
        k = np.asarray(evaluation["channels"][name]["k"], np.float64)
        want = np.asarray(val_k[name], np.float64)[: k.size]
        if k.size > want.size or not np.allclose(k, want, rtol=1e-6):
            raise UserError(
                f"{run / 'quality.jsonl'}: the run was scored on {values['val_path']} (not at hand here), whose "
                f"k bins are not --val {val}'s (another volume size or box); pass the volume the run was scored on"
            )
    logging.getLogger(__name__).warning(
        "%s: the run was scored on %s, which is not at hand here, and records no checksum of it: only its k bins "
        "are checked against --val %s (another volume of the same size and box is not told apart)",
        run / "run.json",
        values["val_path"],
        val,
    )


def at_marks(curve: list[dict], marks: list[float]) -> list[tuple[str, dict | None]]:
    """(mark, evaluation) for each mark in minutes: the last evaluation with ``time_sec`` <= the mark, None
    where none is or the run ended before the mark; then ("end", the run's last evaluation)."""
    end = curve[-1]["time_sec"]
    out = [
        (f"{m:g}", None if 60 * m > end else next((e for e in reversed(curve) if e["time_sec"] <= 60 * m), None))
        for m in marks
    ]
    return out + [("end", curve[-1])]


def model_worst(evaluation: dict, name: str, k_max: float) -> tuple[float, float]:
    """(worst r, worst |P ratio - 1|) of one evaluation's channel ``name`` over the bins it recorded (those
    its run's target tested) with centre k <= ``k_max``; NaN where a value in them is null (a non-finite
    value: a constant prediction has no defined r)."""
    c = evaluation["channels"][name]
    sel = [i for i, k in enumerate(c["k"]) if k <= k_max]
    r = [math.nan if c["r"][i] is None else c["r"][i] for i in sel]
    dev = [math.nan if c["ratio"][i] is None else abs(c["ratio"][i] - 1) for i in sel]
    if not sel or any(math.isnan(v) for v in r + dev):
        return math.nan, math.nan
    return float(min(r)), float(max(dev))


def table(curves: dict, val: Path, marks: list[float], k_max: float) -> tuple[str, list[dict]]:
    """The markdown table of the module docstring and its rows, for ``curves`` (each run's
    ``quality.jsonl`` path -> its evaluations) and the baselines of ``val``."""
    base = baselines(val, k_max, curves)
    head = "| run | minutes | epoch | time s | " + " | ".join(f"{s} r | {s} abs(P-1)" for s in CHANNELS.values()) + " |"
    lines = [head, "|" + "---|" * (4 + 2 * len(CHANNELS))]
    rows = []

    def cells(values: dict) -> str:
        return " | ".join(f"{values[n][0]:.4f} | {values[n][1]:.4f}" if n in values else "- | -" for n in CHANNELS)

    for path, curve in curves.items():
        for mark, e in at_marks(curve, marks):
            if e is None:
                lines.append(f"| {path.parent.name} | {mark} | - | - | " + cells({}) + " |")
                continue
            values = {n: model_worst(e, n, k_max) for n in CHANNELS}
            rows.append(
                {
                    "run": path.parent.name,
                    "minutes": mark,
                    "epoch": e["epoch"],
                    "time_sec": e["time_sec"],
                    **{f"{CHANNELS[n]}_{q}": v for n in values for q, v in zip(("r", "ratio_dev"), values[n])},
                }
            )
            lines.append(f"| {path.parent.name} | {mark} | {e['epoch']} | {e['time_sec']:.0f} | {cells(values)} |")
    for tag, label in (("baseline", "dark matter as gas"), ("non_ml", "non-ML baseline")):
        lines.append(f"| {label} | - | - | - | {cells(base[tag])} |")
        rows.append(
            {
                "run": label,
                **{f"{CHANNELS[n]}_{q}": v for n in base[tag] for q, v in zip(("r", "ratio_dev"), base[tag][n])},
            }
        )
    return "\n".join(lines), rows


def gap_closed(evaluation: dict, ceiling: dict, k_max: float) -> tuple[str, dict[str, float]]:
    """Per k bin <= ``k_max`` of one evaluation: the markdown rows described in the module docstring,
    and channel -> the smallest fraction of the gap closed. ``ceiling`` is ``ceiling.json``'s
    ``channels``; its bins must be the evaluation's (the same volume size and box).

    A bin where the ceiling equals the non-ML baseline's r has no gap: its fraction is NaN and the
    smallest fraction leaves it out.

    Raises:
        ValueError: a channel is missing from ``ceiling``, its k bins differ from the evaluation's, or
            the evaluation has no non-ML baseline's r (a run with ``quality_beat_non_ml`` off).
    """
    lines = ["| channel | k h/Mpc | r | non-ML r | ceiling | gap closed | P ratio |", "|---|---|---|---|---|---|---|"]
    worst_closed = {}
    for name, short in CHANNELS.items():
        c = evaluation["channels"][name]
        if name not in ceiling:
            raise ValueError(f"the ceiling file has no channel {name!r}")
        k = np.asarray(c["k"], np.float64)
        sel = k <= k_max
        kc = np.asarray(ceiling[name]["k"], np.float64)
        if kc.size < sel.sum() or not np.allclose(kc[: sel.sum()], k[sel], rtol=1e-9):
            raise ValueError(f"{name}: the ceiling's k bins are not the evaluation's (another volume size or box?)")
        if c.get("r_non_ml") is None:
            raise ValueError(f"{name}: the evaluation has no non-ML baseline's r (the run had quality_beat_non_ml off)")
        r, nm = (np.asarray(c[q], np.float64)[sel] for q in ("r", "r_non_ml"))
        ceil = np.asarray(ceiling[name]["ceiling"], np.float64)[: sel.sum()]
        ratio = np.asarray(c["ratio"], np.float64)[sel]
        gap = ceil - nm
        closed = np.divide(r - nm, gap, out=np.full_like(gap, np.nan), where=gap != 0)
        worst_closed[name] = float(np.nanmin(closed)) if np.isfinite(closed).any() else math.nan
        for row in zip(k[sel], r, nm, ceil, closed, ratio):
            lines.append(f"| {short} | " + " | ".join(f"{v:.{d}f}" for v, d in zip(row, (2, 4, 4, 4, 3, 3))) + " |")
    return "\n".join(lines), worst_closed


def rejudge(evaluation: dict, target: quality.Target) -> dict:
    """:func:`shared_data.inference.quality.check` of ``target`` on the bins one evaluation record holds
    (those its own target tested: k <= its ``k_max``, at least one mode), with the baselines' r it
    recorded. Returns ``check``'s result.

    Raises:
        ValueError: ``target`` tests bins beyond the record's ``k_max``, or needs a baseline's r that
            the record lacks (its run had that condition off).
    """
    written = evaluation.get("target") or {}
    if written.get("k_max", math.inf) < target.k_max:
        raise ValueError(
            f"epoch {evaluation['epoch']}: recorded up to k = {written['k_max']:g}, "
            f"the target tests to {target.k_max:g}"
        )
    power = {}
    for name, c in evaluation["channels"].items():
        k = c["k"]
        if "k_max" not in written and len(k) >= 2 and k[-1] + (k[-1] - k[-2]) <= target.k_max:
            # a record without a target: its bins must reach the target's k_max
            raise ValueError(
                f"epoch {evaluation['epoch']}: {name}'s recorded bins end at k = {k[-1]:.3g}, "
                f"the target tests to {target.k_max:g}"
            )
        s = {"k": k, "n_modes": [1] * len(k), "r_pred": c["r"], "ratio_pred": c["ratio"]}
        for tag, wanted in (
            ("baseline", target.beat_baseline and name == TEMPERATURE),
            ("non_ml", target.beats_non_ml(name)),
        ):
            if c.get(f"r_{tag}") is not None:
                s[f"r_{tag}"] = c[f"r_{tag}"]
            elif wanted:
                raise ValueError(f"epoch {evaluation['epoch']}: {name} has no recorded r_{tag}, which the target tests")
        power[name] = s
    return quality.check({"power": power}, target)


def first_met(curve: list[dict], target: quality.Target) -> tuple[dict | None, int, int]:
    """(the first evaluation that meets ``target`` or None, how many evaluations after it meet it, how many
    come after it), each judged by :func:`rejudge`."""
    verdicts = [rejudge(e, target)["met"] for e in curve]
    if True not in verdicts:
        return None, 0, 0
    i = verdicts.index(True)
    return curve[i], sum(verdicts[i + 1 :]), len(verdicts) - i - 1


def _outward(x: float, up: bool) -> float:
    """``x`` on the 0.01 grid, rounded up (``up``) or down, so that the result never lies on the wrong
    side of ``x`` (the grid values are floats, 0.43 a hair below 43/100)."""
    v = round(x, 2)
    if up and v < x:
        v = round(v + 0.01, 2)
    elif not up and v > x:
        v = round(v - 0.01, 2)
    return v


def held(curve: list[dict], start_min: float, end_min: float | None, k_max: float) -> dict[str, tuple[float, float]]:
    """Channel -> (r_min, ratio_tol) that every evaluation from the ``start_min`` mark's to the ``end_min``
    mark's (:func:`at_marks`: the last one finished by each; ``end_min`` None: the run's last
    evaluation) holds in its bins up to ``k_max``: the smallest worst-bin r rounded down to 0.01 and the
    largest worst-bin |P ratio - 1| rounded up to 0.01.

    Raises:
        ValueError: ``start_min`` > ``end_min``, the run ended before ``end_min``, it has no evaluation
            by ``start_min``, or an evaluation in the window has no defined r or P ratio (a collapsed
            model: no threshold holds there).
    """
    if end_min is not None and start_min > end_min:
        raise ValueError(f"the window {start_min:g} to {end_min:g} minutes ends before it starts")
    found = at_marks(curve, [start_min] if end_min is None else [start_min, end_min])
    first, end = found[0][1], found[-1][1]
    last = end if end_min is None else found[1][1]
    if last is None:
        raise ValueError(f"the run ended at {end['time_sec']:.0f} s, before the {end_min:g}-minute mark")
    if first is None:
        raise ValueError(
            f"the run has no evaluation by the {start_min:g}-minute mark (its first at {curve[0]['time_sec']:.0f} s)"
        )
    window = [e for e in curve if first["time_sec"] <= e["time_sec"] <= last["time_sec"]]
    out = {}
    for name in CHANNELS:
        worst = [model_worst(e, name, k_max) for e in window]
        undefined = [e["epoch"] for e, (r, dev) in zip(window, worst) if math.isnan(r) or math.isnan(dev)]
        if undefined:
            raise ValueError(f"{name}: epoch {undefined[0]} has no defined r or P ratio (a collapsed model)")
        out[name] = (_outward(min(r for r, _ in worst), up=False), _outward(max(d for _, d in worst), up=True))
    return out


def _report_held(curve: list[dict], hold: list[float | None], k_max: float) -> str:
    values = held(curve, *hold, k_max)
    text = "; ".join(f"{CHANNELS[n]} r >= {r:.2f}, |P ratio - 1| <= {d:.2f}" for n, (r, d) in values.items())
    if hold[1] is None:
        window = f"from the {hold[0]:g}-minute mark to the run's end ({curve[-1]['time_sec'] / 60:.1f} minutes)"
    else:
        window = f"from {hold[0]:g} to {hold[1]:g} minutes"
    return f"every evaluation {window} holds {text}"


def _report_target(curve: list[dict], target: quality.Target, config: str) -> str:
    e, kept, later = first_met(curve, target)
    if e is None:
        verdict = f"not met in {len(curve)} evaluation" + "s" * (len(curve) != 1)
    elif later == 0:  # a time-to-quality run stops at the evaluation that meets its target
        verdict = f"met at epoch {e['epoch']} ({e['time_sec']:.0f} s), the run's last evaluation"
    else:
        verdict = f"met first at epoch {e['epoch']} ({e['time_sec']:.0f} s), then in {kept} of {later} later "
        verdict += "evaluation" + "s" * (later != 1)
    return f"the target of config {config!r} ({target.describe()}): {verdict}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path, help="folder of run folders, each with quality.jsonl")
    parser.add_argument("--val", type=Path, required=True, help="the validation volume the runs were scored on")
    parser.add_argument("--marks", default="1,2,5,10", help="minutes from the trainer's start (comma-separated)")
    parser.add_argument("--k_max", type=float, default=6.3, help="the last k bin centre tested, h/Mpc")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON lines here")
    parser.add_argument("--ceiling", type=Path, help="ceiling.json of ceiling.py on the same volume: per-bin tables")
    parser.add_argument("--config", help="judge every evaluation against this config's target (quality_* keys)")
    parser.add_argument(
        "--hold", help="A,B: the thresholds every evaluation from A to B minutes holds (A,end: to the run's end)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)  # stderr: stdout is the table
    hold = None
    if args.hold is not None:
        try:
            hold = [None if m.strip() == "end" and i == 1 else float(m) for i, m in enumerate(args.hold.split(","))]
            assert len(hold) == 2 and all(m is None or (math.isfinite(m) and m >= 0) for m in hold)
            assert hold[1] is None or hold[0] <= hold[1]
        except (ValueError, AssertionError, TypeError):
            parser.error(f"--hold {args.hold!r}: expected two minutes A,B with 0 <= A <= B, e.g. 5,10, or A,end")
    target = None
    if args.config is not None:
        try:
            target = quality.Target.from_config(config_mod.load_config(args.config))
        except Exception as err:  # a ConfigError names the config and the key
            print(f"error: --config {args.config}: {err}", file=sys.stderr)
            return 2
    try:
        marks = [float(m) for m in args.marks.split(",")]
    except ValueError:
        parser.error(f"--marks {args.marks!r}: expected comma-separated minutes, e.g. 1,2,5,10")
    if not list(args.records.glob("*/quality.jsonl")):
        print(f"error: {args.records}: no */quality.jsonl", file=sys.stderr)
        return 2
    curves = {path: quality.read_evaluations(path.parent) for path in sorted(args.records.glob("*/quality.jsonl"))}
    empty = [path for path, curve in curves.items() if not curve]
    if empty:
        print(f"error: {empty[0]}: no evaluation (the run stopped before its first)", file=sys.stderr)
        return 2
    ceiling = None
    if args.ceiling:
        try:
            ceiling = json.loads(args.ceiling.read_text())["channels"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
            why = "no 'channels'" if isinstance(err, (KeyError, TypeError)) else str(err)
            print(f"error: {args.ceiling}: not a ceiling.py result ({why})", file=sys.stderr)
            return 2
    text, rows = table(curves, args.val, marks, args.k_max)
    print(text)
    if ceiling is not None:
        for path, curve in curves.items():
            last = curve[-1]
            try:
                bins, worst_closed = gap_closed(last, ceiling, args.k_max)
            except (ValueError, KeyError, TypeError) as err:
                print(f"error: {args.ceiling} against {path}: {err}", file=sys.stderr)
                return 2
            print(f"\n{path.parent.name}, epoch {last['epoch']} ({last['time_sec']:.0f} s):\n{bins}")
            print("smallest gap closed: " + ", ".join(f"{CHANNELS[n]} {v:.3f}" for n, v in worst_closed.items()))
    reports = []
    if hold:
        reports.append(lambda curve: _report_held(curve, hold, args.k_max))
    if target:
        reports.append(lambda curve: _report_target(curve, target, args.config))
    rc = 0
    for path, curve in curves.items() if reports else ():
        for report in reports:
            try:
                print(f"\n{path.parent.name}: " + report(curve))
            except ValueError as err:  # this run's error; the rest is still reported
                print(f"error: {path}: {err}", file=sys.stderr)
                rc = 2
    if args.json:
        with writing(args.json):
            write_atomic(args.json, "".join(json.dumps(r) + "\n" for r in rows))
    return rc


if __name__ == "__main__":
    sys.exit(run_cli(main))
