"""What a rung's numbers say: the bottleneck (:func:`verdict`: input-bound, compute-bound or
unreliable), the FULL speedups over the baseline and the previous rung, the rung's summary record
(:func:`summarize`) and its one lesson line.
"""

from __future__ import annotations

import dataclasses

from dlas_compare.benchmark import MODES
from dlas_compare.ladder_rungs import Step

INPUT_BOUND = 0.8  # FULL below this fraction of SYNTHETIC (and IO below SYNTHETIC): input-bound
UNRELIABLE = 1.1  # FULL above this multiple of IO or of SYNTHETIC: the windows measured noise
SAME = 0.05  # a FULL ratio within 1 +- SAME over the previous rung counts as no change


def verdict(io: float | None, synthetic: float | None, full: float | None) -> tuple[str | None, str]:
    """The bottleneck of a rung from its samples/s, and why in words.

    ``unreliable`` when FULL > :data:`UNRELIABLE` x IO or FULL > :data:`UNRELIABLE` x SYNTHETIC:
    training on the input can outrun neither the input alone nor the train step alone, so the
    windows measured noise (too few steps, batches read ahead, a machine shared with other work), and
    no bottleneck is drawn from them (the factor leaves a 10% band for timing noise). Else
    ``input-bound`` when FULL < :data:`INPUT_BOUND` x SYNTHETIC and IO < SYNTHETIC (or IO was not
    measured); ``compute-bound`` otherwise; None without SYNTHETIC or FULL.
    """
    if synthetic is None or full is None:
        return None, "no verdict without SYNTHETIC and FULL"
    if io is not None and full > UNRELIABLE * io:
        return "unreliable", (
            f"FULL {full:.1f} > {UNRELIABLE} x IO {io:.1f}: training on the input cannot outrun the input "
            "alone, so these windows measured noise; no conclusion"
        )
    if full > UNRELIABLE * synthetic:
        return "unreliable", (
            f"FULL {full:.1f} > {UNRELIABLE} x SYNTHETIC {synthetic:.1f}: training on the input cannot outrun "
            "the train step alone, so these windows measured noise; no conclusion"
        )
    low = full < INPUT_BOUND * synthetic
    if low and (io is None or io < synthetic):
        io_text = "IO not measured" if io is None else f"IO {io:.1f} < SYNTHETIC"
        return "input-bound", f"FULL {full:.1f} < {INPUT_BOUND} x SYNTHETIC {synthetic:.1f} and {io_text}"
    if low:
        return "compute-bound", (
            f"IO {io:.1f} >= SYNTHETIC {synthetic:.1f}, yet FULL {full:.1f} < {INPUT_BOUND} x SYNTHETIC: "
            "input and step contend for the host"
        )
    return "compute-bound", f"FULL {full:.1f} >= {INPUT_BOUND} x SYNTHETIC {synthetic:.1f}"


def effect(ratio: float) -> str:
    """Words for a FULL ratio over the previous rung (:data:`SAME` is the band of no change)."""
    if ratio > 1 + SAME:
        return "faster"
    if ratio < 1 - SAME:
        return "this rung slowed FULL down here"
    return f"no change beyond {100 * SAME:.0f}%"


def summarize(step: Step, records: list[dict], status: str, reason: str | None, ran: list[dict]) -> dict:
    """The summary record of one rung from its benchmark ``records``; ``ran`` holds the summaries of
    the rungs of the same framework that ran before it (the first is the baseline when it ran). A mode
    the rung did not measure (its change cannot move it, :data:`dlas_compare.ladder_budget.CHANGED_MODES`)
    takes the previous rung's value; ``values_from`` names the rung each value was measured at."""
    by_mode = {r["mode"]: r for r in records}
    base = ran[0] if ran and ran[0]["ladder_rung"] == "baseline" else None
    prev = ran[-1] if ran else None
    values, values_from = {}, {}
    for mode in MODES:
        if mode in by_mode:
            values[mode], values_from[mode] = by_mode[mode]["samples_per_sec"], step.index
        elif status == "ran" and prev and prev[f"{mode}_samples_per_sec"] is not None:
            values[mode], values_from[mode] = prev[f"{mode}_samples_per_sec"], prev["values_from"][mode]
        else:
            values[mode] = None
    io, synthetic, full = values["io"], values["synthetic"], values["full"]
    ratio = lambda other: full / other["full_samples_per_sec"] if (full and other) else None
    is_base = step.rung.name == "baseline" and full is not None
    bound, why = verdict(io, synthetic, full) if status == "ran" else (None, "")
    summary = {
        "record": "ladder_summary",
        "framework": step.framework,
        "ladder_step": step.index,
        "ladder_rung": step.rung.name,
        "rung_title": step.rung.title,
        "status": status,
        "reason": reason,
        "ladder_settings": dataclasses.asdict(step.settings),
        "measured_modes": [m for m in MODES if m in by_mode],
        "values_from": values_from,
        "io_samples_per_sec": io,
        "synthetic_samples_per_sec": synthetic,
        "full_samples_per_sec": full,
        "full_samples_per_sec_min": by_mode["full"]["samples_per_sec_min"] if "full" in by_mode else None,
        "full_samples_per_sec_max": by_mode["full"]["samples_per_sec_max"] if "full" in by_mode else None,
        "speedup_vs_baseline": 1.0 if is_base else ratio(base),
        "speedup_vs_previous": ratio(prev),
        "previous_rung": prev["ladder_rung"] if prev else None,
        "verdict": bound,
        "verdict_reason": why,
        "note": step.note,
        "device": next((r["device"] for r in records), None),
        "global_batch": next((r["global_batch"] for r in records), None),
        "crop_size": next((r["crop_size"] for r in records if "crop_size" in r), None),
        "replicas": step.settings.num_devices,
        "replica_check": next((r["replica_check"] for r in records if r.get("replica_check")), None),
    }
    summary["line"] = lesson_line(summary, step, prev)
    return summary


def lesson_line(summary: dict, step: Step, prev: dict | None) -> str:
    """One line: the rung's lesson, what FULL did, the bottleneck and where it moved."""
    head = f"{step.framework} {step.index}. {step.rung.title}: {step.rung.lesson}"
    if summary["status"] != "ran":
        return f"{head}; {summary['status']}: {summary['reason']}"
    parts = [head]
    full = summary["full_samples_per_sec"]
    if step.rung.name == "baseline":
        s = step.settings
        xla = {"tf": ", no XLA", "jax": ", the kit's XLA flags off"}.get(step.framework, "")
        parts.append(f"{s.data_loader_config}, {s.num_data_workers} workers, fp32{xla}: FULL {full:.1f} samples/s")
    elif summary["speedup_vs_previous"] is not None:
        base = summary["speedup_vs_baseline"]
        parts.append(
            f"FULL {full:.1f} samples/s, x{summary['speedup_vs_previous']:.2f} over {prev['rung_title']} "
            f"({effect(summary['speedup_vs_previous'])})"
            + (f", x{base:.2f} over the baseline" if base and prev["ladder_rung"] != "baseline" else "")
        )
    if summary["verdict"]:
        moved = ""
        if prev and prev["verdict"] and step.rung.name != "baseline":
            before, after = prev["verdict"], summary["verdict"]
            moved = f" (was {before}: the bottleneck moved)" if before != after else " (as before)"
        parts.append(f"{summary['verdict']}{moved}: {summary['verdict_reason']}")
    if summary.get("replica_check"):
        parts.append(replica_line(summary["replica_check"]))
    if step.note:
        parts.append(step.note)
    return "; ".join(parts)


def replica_line(check: dict) -> str:
    """The data-parallel rung's loss check (:func:`dlas_compare.benchmark_session.replica_check`) in words:
    the replicas, the global batch, each step's loss on one device and on the replicas, and their
    largest relative difference against the tolerance (float32 sums in another order)."""
    pairs = ", ".join(f"{a:.7g}/{b:.7g}" for a, b in zip(check["losses_one_device"], check["losses_replicas"]))
    verdict = "equal" if check["equal"] else "NOT equal to"
    within = "within" if check["equal"] else "over"
    return (
        f"{check['replicas']} replicas, global batch {check['global_batch']}: the losses of {check['steps']} steps "
        f"{verdict} one device's (1 device/replicas: {pairs}; max relative difference {check['max_rel_diff']:.1e}, "
        f"{within} {check['rtol']:g})"
    )
