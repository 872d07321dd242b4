"""The ladder's table on stdout (:func:`table`) and the noise of this machine read from the SYNTHETIC
rates its rungs repeat (:func:`noise_lines`).
"""

from __future__ import annotations

from dlas_compare.ladder_rungs import RUNGS


def table(summaries: list[dict]) -> str:
    """Framework, rung, IO / SYNTHETIC / FULL samples/s (in parentheses: taken from an earlier rung,
    which measured it), FULL x baseline, x previous, verdict, a framework's rungs together in order; a
    framework skipped at every rung for one reason gets one row."""
    first = {fw: i for i, fw in enumerate(dict.fromkeys(s["framework"] for s in summaries))}
    summaries = sorted(summaries, key=lambda s: (first[s["framework"]], s["ladder_step"]))
    head = f"{'framework':<10}{'rung':<22}{'IO':>10}{'SYNTHETIC':>11}{'FULL':>10}{'x base':>8}{'x prev':>8}  verdict"
    lines = [head, "-" * len(head)]
    num = lambda v, fmt="{:.1f}": fmt.format(v) if v is not None else "-"
    shown = set()
    for s in summaries:
        fw = s["framework"]
        same = [t for t in summaries if t["framework"] == fw]
        if all(t["status"] == "skipped" and t["reason"] == s["reason"] for t in same) and len(same) == len(RUNGS):
            if fw not in shown:
                lines.append(f"{fw:<10}{'(every rung)':<22}skipped: {s['reason']}")
                shown.add(fw)
            continue
        rung = f"{s['ladder_step']} {s['rung_title']}"
        if s["status"] != "ran":
            lines.append(f"{fw:<10}{rung:<22}{s['status']}: {s['reason']}")
            continue
        rate = lambda mode: (
            num(s[f"{mode}_samples_per_sec"])
            if s.get("values_from", {}).get(mode, s["ladder_step"]) == s["ladder_step"]
            else f"({num(s[f'{mode}_samples_per_sec'])})"
        )
        lines.append(
            f"{fw:<10}{rung:<22}{rate('io'):>10}{rate('synthetic'):>11}"
            f"{rate('full'):>10}{num(s['speedup_vs_baseline'], '{:.2f}'):>8}"
            f"{num(s['speedup_vs_previous'], '{:.2f}'):>8}  {s['verdict'] or '-'}"
        )
    return "\n".join(lines)


STEP_KEYS = ("enable_amp", "enable_jit", "kit_xla_flags", "num_devices", "local_batch_size")


def noise_lines(summaries: list[dict]) -> list[str]:
    """Per framework, the spread of SYNTHETIC over the rungs that ran the baseline's train step
    (settings equal in :data:`STEP_KEYS`; only the input differs, which SYNTHETIC does not use): the
    same measurement repeated, so FULL ratios within that spread are noise of this machine."""
    lines = []
    for fw in dict.fromkeys(s["framework"] for s in summaries):
        ran = [s for s in summaries if s["framework"] == fw and s["status"] == "ran" and s["synthetic_samples_per_sec"]]
        ran = [s for s in ran if s.get("values_from", {}).get("synthetic", s["ladder_step"]) == s["ladder_step"]]
        if not ran or ran[0]["ladder_rung"] != "baseline":
            continue
        key = lambda s: [s["ladder_settings"][k] for k in STEP_KEYS]
        same = [s for s in ran if key(s) == key(ran[0])]
        if len(same) < 2:
            continue
        rates = [s["synthetic_samples_per_sec"] for s in same]
        rungs = ", ".join(str(s["ladder_step"]) for s in same)
        lines.append(
            f"{fw}: SYNTHETIC of rungs {rungs} (one train step, only the input differs) spans "
            f"{min(rates):.1f}-{max(rates):.1f} samples/s (x{max(rates) / min(rates):.2f}): "
            "ratios within that spread are this machine's noise"
        )
    return lines
