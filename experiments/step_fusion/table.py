"""Bookkeeping and table of the step-fusion study (``experiments/step_fusion/run.sh``): each variant's
record, the combination of the levers that helped, and the table the call prints last.

    python experiments/step_fusion/table.py record DIR --index I --name NAME --sets="K=V ..." \\
        --flags="--xla_... ..." --rc RC --wall_s S [--skipped REASON]
    python experiments/step_fusion/table.py combination ROOT    # "K=V ...|FLAGS|WINNERS", exit 1 if < 2 winners
    python experiments/step_fusion/table.py table ROOT          # the table, Markdown

``ROOT`` holds one folder per variant: ``variant.json`` (written by ``record``: name, run order, config
overrides, XLA flags, exit status, wall seconds, status, the reason of a failure) beside what
``python -m dlas_compare.step_breakdown`` wrote there (``breakdown.json``, ``trace.json.gz``, ``hlo.txt``)
and its output (``breakdown.md``, ``stderr.log``).

Step time is the breakdown's untraced timed step (``step_s``, the mean of ``--steps`` steps). MFU is the
model's training FLOPs per step over that time against the device's datasheet dense peak for the
compute dtype, and beside it the fraction of the measured matrix-product rate
(:mod:`dlas_compare.peaks`: H200 bf16 989.4 and 788 TFLOP/s); "-" where the device has no such number
(a CPU). A lever joins the combination when it shortens the baseline's step by more than :data:`NOISE`
of it; where two winners set the same config key or XLA flag, the faster one's value is kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dlas_compare import peaks
from shared_data.core.files import write_atomic

#: A lever joins the combination when it shortens the baseline's step by more than this share of it.
NOISE = 0.01
BASELINE = "baseline"
#: Variants that are not levers: never winners.
NOT_LEVERS = (BASELINE, "combination", "baseline_repeat")
#: The breakdown's columns: (title, ``kinds`` key of breakdown.json, or a ``totals`` key).
COLUMNS = (
    ("convolutions", "totals", "conv_ms"),
    ("depth-to-space", "kinds", "depth-to-space shuffles"),
    ("Adam", "kinds", "Adam"),
    ("pads", "kinds", "pads"),
    ("kernel regrouping", "kinds", "kernel regrouping"),
    ("bias & activations", "kinds", "bias and activations"),
    ("all other", "totals", "other_ms"),
)


def status_of(rc: int, folder: Path, skipped: str | None) -> str:
    """``ok`` (exit 0 and a breakdown written), ``timed out`` (``timeout``'s 124 or a kill's 137),
    ``skipped`` or ``failed``."""
    if skipped is not None:
        return "skipped"
    if rc == 0 and (folder / "breakdown.json").is_file():
        return "ok"
    return "timed out" if rc in (124, 137) else "failed"


def failure_reason(folder: Path) -> str:
    """The last line of the variant's ``stderr.log`` that names an error (an unknown XLA flag aborts
    with ``Unknown flag``), else its last line; "" when there is none."""
    log = folder / "stderr.log"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    keys = ("error", "unknown flag", "check failed", "fatal", "killed", "out of memory")
    named = [ln for ln in lines if any(k in ln.lower() for k in keys)]
    return (named or lines or [""])[-1][:300]


def record(args: argparse.Namespace) -> dict:
    """Write ``variant.json`` into ``args.dir`` (atomically) and return it."""
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    status = status_of(args.rc, folder, args.skipped)
    rec = {
        "name": args.name,
        "index": args.index,
        "sets": args.sets.split(),
        "flags": args.flags.split(),
        "rc": args.rc,
        "wall_s": args.wall_s,
        "status": status,
        "reason": args.skipped if status == "skipped" else ("" if status == "ok" else failure_reason(folder)),
    }
    write_atomic(folder / "variant.json", json.dumps(rec, indent=1))
    return rec


def load(root: Path) -> list[dict]:
    """Every variant under ``root`` in run order: its ``variant.json`` with its ``breakdown.json`` (when
    it has one) under ``"breakdown"``."""
    out = []
    for path in sorted(root.glob("*/variant.json")):
        rec = json.loads(path.read_text())
        bd = path.parent / "breakdown.json"
        rec["breakdown"] = json.loads(bd.read_text()) if rec["status"] == "ok" and bd.is_file() else None
        out.append(rec)
    return sorted(out, key=lambda r: r["index"])


def step_ms(rec: dict) -> float | None:
    return 1e3 * rec["breakdown"]["step_s"] if rec.get("breakdown") else None


def column_ms(bd: dict, where: str, key: str) -> float:
    return bd["totals"][key] if where == "totals" else bd["kinds"].get(key, {}).get("ms", 0.0)


def combination(variants: list[dict]) -> dict:
    """The levers that shortened the baseline's step by more than :data:`NOISE` of it, fastest first, and
    their union: ``{"winners", "sets", "flags", "gain_ms"}``. A config key or XLA flag two winners set
    keeps the faster winner's value.

    Raises:
        SystemExit: no baseline with a step time.
    """
    by_name = {r["name"]: r for r in variants if step_ms(r) is not None}
    if BASELINE not in by_name:
        raise SystemExit("error: combination: the baseline has no step time (it failed or was not run)")
    base = step_ms(by_name[BASELINE])
    gain = {n: base - step_ms(r) for n, r in by_name.items() if n not in NOT_LEVERS}
    winners = sorted((n for n, g in gain.items() if g > NOISE * base), key=lambda n: -gain[n])
    sets, flags = {}, {}
    for name in winners:
        for kv in by_name[name]["sets"]:
            sets.setdefault(kv.split("=", 1)[0], kv)
        for flag in by_name[name]["flags"]:
            flags.setdefault(flag.split("=", 1)[0], flag)
    return {"winners": winners, "sets": list(sets.values()), "flags": list(flags.values()), "gain_ms": gain}


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def table(variants: list[dict]) -> str:
    """The variants as two Markdown tables (absolute, then the change against the baseline), a header
    naming config, device and peaks, and notes: each variant's levers, failures and skips."""
    done = [r for r in variants if r.get("breakdown")]
    if not done:
        return "no variant produced a breakdown:\n" + "\n".join(
            f"- {r['name']}: {r['status']} (rc {r['rc']}) {r['reason']}" for r in variants
        )
    first = done[0]["breakdown"]
    base = next((r for r in done if r["name"] == BASELINE), None)
    peak = peaks.datasheet_tflops(first["device"], first["precision"])
    measured = peaks.measured_tflops(first["device"], first["precision"])
    gflop = first["totals"]["model_gflop"]
    lines = [
        f"{first['config']}, {first['precision']}, batch {first['batch']}, {first['device']}, "
        f"{first['steps']} timed steps per variant (untraced, after warm-up), then as many traced; "
        f"model FLOPs {gflop:.4g} GFLOP per step; MFU against the datasheet dense peak "
        f"({_fmt(peak, '.1f')} TFLOP/s) and as a share of the measured matmul rate ({_fmt(measured, '.0f')} TFLOP/s)",
        "",
        "| variant | status | step ms | vs baseline | samples/s | MFU datasheet | of measured | "
        + " | ".join(c[0] for c in COLUMNS)
        + " |",
        "|---" * (7 + len(COLUMNS)) + "|",
    ]
    for r in variants:
        bd = r.get("breakdown")
        if not bd:
            lines.append(f"| {r['name']} | {r['status']} |" + " |" * (5 + len(COLUMNS)))
            continue
        ms = step_ms(r)
        use = peaks.utilisation(gflop * 1e9 / bd["batch"], bd["batch"] / bd["step_s"], bd["device"], bd["precision"])
        delta = f"{ms - step_ms(base):+.2f} ms" if base and r is not base else ""
        lines.append(
            f"| {r['name']} | ok | {ms:.2f} | {delta} | {bd['samples_per_sec']:.1f} | "
            f"{_pct(use['mfu'])} | {_pct(use['mfu_of_measured_matmul'])} | "
            + " | ".join(f"{column_ms(bd, w, k):.2f}" for _, w, k in COLUMNS)
            + " |"
        )
    if base:
        lines += [
            "",
            "change against the baseline, ms per step (negative: faster)",
            "",
            "| variant | step | " + " | ".join(c[0] for c in COLUMNS) + " |",
            "|---" * (2 + len(COLUMNS)) + "|",
        ]
        b = base["breakdown"]
        for r in done:
            if r is base:
                continue
            bd = r["breakdown"]
            lines.append(
                f"| {r['name']} | {step_ms(r) - step_ms(base):+.2f} | "
                + " | ".join(f"{column_ms(bd, w, k) - column_ms(b, w, k):+.2f}" for _, w, k in COLUMNS)
                + " |"
            )
    lines += ["", "variants (config overrides; XLA flags added to the kit's):"]
    for r in variants:
        what = " ".join(r["sets"] + r["flags"]) or "the config as it is"
        note = {"ok": f", {r['wall_s']} s", "skipped": f": skipped: {r['reason']}"}.get(
            r["status"], f": {r['status']} (rc {r['rc']}, {r['wall_s']} s): {r['reason']}"
        )
        lines.append(f"- {r['name']}: {what}{note}")
    if base:
        combo = combination(variants)
        lines.append(
            f"winners (> {100 * NOISE:.0f}% faster than the baseline): "
            + (", ".join(f"{n} ({-combo['gain_ms'][n]:+.2f} ms)" for n in combo["winners"]) or "none")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="table.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="write a variant's variant.json")
    r.add_argument("dir")
    r.add_argument("--index", type=int, required=True, help="the variant's place in the call's run order")
    r.add_argument("--name", required=True)
    r.add_argument("--sets", default="", help="space-separated KEY=VALUE config overrides")
    r.add_argument("--flags", default="", help="space-separated XLA flags")
    r.add_argument("--rc", type=int, default=0, help="the exit status of its step_breakdown process")
    r.add_argument("--wall_s", type=int, default=0, help="seconds its process ran")
    r.add_argument("--skipped", help="not run, and why")
    for name, text in (("combination", "the combination of the winners"), ("table", "print the table")):
        sub.add_parser(name, help=text).add_argument("root", help="the folder of the variants' folders")
    args = p.parse_args(argv)
    if args.command == "record":
        rec = record(args)
        print(f"[step_fusion] {rec['name']}: {rec['status']}" + (f": {rec['reason']}" if rec["reason"] else ""))
        return 0
    variants = load(Path(args.root))
    if args.command == "table":
        print(table(variants))
        return 0
    combo = combination(variants)
    if len(combo["winners"]) < 2:
        print(f"{len(combo['winners'])} winner(s) ({', '.join(combo['winners']) or 'none'}): no combination to measure")
        return 1
    print(f"{' '.join(combo['sets'])}|{' '.join(combo['flags'])}|{','.join(combo['winners'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
