"""The step levers of this study, measured in one process: SYNTHETIC steps of one config with one lever
each (JAX or TF), the combination of the levers that helped, and step breakdowns of chosen variants.

    python experiments/h200_mfu/levers.py run --framework jax --config short_opt --out R.jsonl \\
        --variants baseline upconv=subpixel_crop ... [--breakdown baseline=DIR] [--deadline EPOCH_S]
    python experiments/h200_mfu/levers.py choose R.jsonl --out best.json
    python experiments/h200_mfu/levers.py run --framework tf --best best.json --variants best ...
    python experiments/h200_mfu/levers.py table OUT/jax.jsonl OUT/tf.jsonl ... [--breakdowns B0 B1]

A variant is a name of :data:`LEVERS` (config overrides), ``command_buffers`` (the baseline, run in a
process whose ``XLA_FLAGS`` hold :data:`COMMAND_BUFFER_FLAGS`) or ``best`` (the overrides of
``--best``, those TF has for ``--framework tf``). Each variant's record (``dlas_compare.benchmark``'s,
plus ``variant``, ``overrides``, ``xla_flags``) is appended to ``--out`` as it ends; a variant that
raises is recorded with its ``failure``; one that ended the process (it was started, never recorded)
is recorded as such by the next ``run`` on the same ``--out``, which then goes on with the rest.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

from dlas_compare import step_breakdown
from dlas_compare.benchmark_session import make_bench
from dlas_compare.benchmark_timing import run_bench
from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.files import write_atomic

#: The step's forms every variant starts from: the default of each lever's key (``configs/UNet.yaml``'s
#: ``short_opt`` carries the combination this study chose, so its own values are not the baseline).
BASELINE_FORMS = {
    "upconv": "subpixel",
    "conv_pad": "separate",
    "kernel_regroup": "gather",
    "skip_concat": "concat",
    "adam_update": "per_tensor",
    "pad_out_channels": 0,
}
LEVERS: dict[str, dict] = {
    "baseline": {},
    "upconv=subpixel_crop": {"upconv": "subpixel_crop"},
    "upconv=transpose": {"upconv": "transpose"},
    "conv_pad=folded": {"conv_pad": "folded"},
    "kernel_regroup=transpose": {"kernel_regroup": "transpose"},
    "skip_concat=split": {"skip_concat": "split"},
    "adam_update=flat": {"adam_update": "flat"},
    "pad_out_channels=8": {"pad_out_channels": 8},
}
#: Whole-step command buffers (CUDA graphs): the convolutions, cuDNN and library calls recorded into
#: XLA's command buffers beside the fusions, and graphs of any size.
COMMAND_BUFFER_FLAGS = (
    "--xla_gpu_enable_command_buffer=+CONVOLUTION,+CUDNN,+CUSTOM_CALL,+CUBLAS,+CUBLASLT"
    " --xla_gpu_graph_min_graph_size=1"
)
#: The config keys of the levers TF has (``adam_update: flat`` is JAX's).
TF_KEYS = ("upconv", "conv_pad", "kernel_regroup", "skip_concat", "pad_out_channels")
#: A lever joins the combination when it shortens the baseline's median step by more than this share.
NOISE = 0.01
TRACED_STEPS = 5


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def append(path: Path, record: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def overrides_of(name: str, framework: str, best: dict | None) -> dict:
    """The config overrides of variant ``name`` (TF keeps only :data:`TF_KEYS`)."""
    if name == "best":
        if best is None:
            raise SystemExit("error: variant 'best' needs --best FILE (written by `levers.py choose`)")
        over = dict(best["overrides"])
    elif name == "command_buffers":
        if COMMAND_BUFFER_FLAGS not in os.environ.get("XLA_FLAGS", ""):
            raise SystemExit(f"error: variant 'command_buffers' needs XLA_FLAGS to hold {COMMAND_BUFFER_FLAGS!r}")
        over = {}
    elif name in LEVERS:
        over = dict(LEVERS[name])
    else:
        names = ", ".join(["best", "command_buffers", *LEVERS])
        raise SystemExit(f"error: unknown variant {name!r}: expected one of {names}")
    return {k: v for k, v in over.items() if k in TF_KEYS} if framework == "tf" else over


def why(err: Exception) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:300]}"


def write_breakdown(bench, cfg, folder: Path) -> dict:
    """Trace the ready JAX ``bench`` (:func:`dlas_compare.step_breakdown.trace_bench`) and write
    ``breakdown.json`` and ``breakdown.md`` to ``folder``; return the totals."""
    folder.mkdir(parents=True, exist_ok=True)
    hlo, events, device, step_s = step_breakdown.trace_bench(bench, TRACED_STEPS, 2, folder)
    batch = config_mod.batch_sizes(cfg, 1)[0]
    result = step_breakdown.breakdown(hlo, events, TRACED_STEPS, cfg, batch, device)
    result.update(step_s=step_s, steps=TRACED_STEPS, config_values=config_mod.config_dict(cfg))
    write_atomic(folder / "breakdown.json", json.dumps(result, indent=1))
    write_atomic(folder / "breakdown.md", step_breakdown.tables(result) + "\n")
    return result["totals"]


def run(args: argparse.Namespace) -> int:
    base = config_mod.replace(config_cli.config_from_args(args), **BASELINE_FORMS)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    best = json.loads(Path(args.best).read_text()) if args.best and Path(args.best).exists() else None
    dirs = dict(item.split("=", 1) for item in args.breakdown)
    started = out.with_name(out.name + ".started")
    tried = set(started.read_text().split("\n")) if started.exists() else set()
    done = {r["label"] for r in read_records(out)}
    for name in args.variants:
        label = f"{args.framework} {name}"
        if label in done:
            continue
        common = {"label": label, "variant": name, "framework": args.framework}
        if label in tried:
            append(out, {**common, "failure": "the process ended during this variant"})
            continue
        if args.deadline and time.time() + args.estimate > args.deadline:
            append(out, {**common, "failure": f"skipped: less than {args.estimate:.0f} s left in the call"})
            continue
        with open(started, "a") as fh:
            fh.write(label + "\n")
        over = overrides_of(name, args.framework, best)
        cfg = config_mod.replace(base, **over)
        print(f"[levers] {label}: {over or 'the default forms'}", file=sys.stderr, flush=True)
        bench = None
        try:
            bench = make_bench(args.framework, cfg, "synthetic")
            rec = run_bench(bench, cfg, "synthetic", args.warmup, args.steps, args.windows, label)
            rec.update(common, overrides=over, xla_flags=os.environ.get("XLA_FLAGS", ""))
        except Exception as err:  # a lever that fails is a result of this study, and the others still run
            rec = {**common, "overrides": over, "failure": why(err)}
        if name in dirs and args.framework == "jax" and "failure" not in rec:
            try:
                rec["breakdown"] = {"folder": dirs[name], **write_breakdown(bench, cfg, Path(dirs[name]))}
            except Exception as err:  # the step time stays recorded
                rec["breakdown"] = {"folder": dirs[name], "failure": why(err)}
        append(out, rec)
        print(f"[levers] {label}: {rec.get('step_ms_p50', rec.get('failure'))}", file=sys.stderr, flush=True)
        del bench
        gc.collect()
        if args.framework == "jax":
            import jax

            jax.clear_caches()
    return 0


def choose(records: list[dict]) -> dict:
    """The combination: every lever that shortened the JAX baseline's median step by more than
    :data:`NOISE` of it, the fastest of the ``upconv`` forms among them, and the command-buffer flags
    when they did. Returns ``{"overrides", "xla_flags", "levers", "gain_ms", "baseline_ms"}``.

    Raises:
        SystemExit: no JAX baseline record with a step time.
    """
    by_variant = {r["variant"]: r for r in records if r.get("framework") == "jax" and "step_ms_p50" in r}
    if "baseline" not in by_variant:
        raise SystemExit("error: choose: no measured JAX baseline among the records")
    base = by_variant["baseline"]["step_ms_p50"]
    gain = {n: base - r["step_ms_p50"] for n, r in by_variant.items() if n not in ("baseline", "best")}
    winners = sorted((n for n, g in gain.items() if g > NOISE * base), key=lambda n: -gain[n])
    ups = [n for n in winners if n.startswith("upconv=")]
    levers = [n for n in winners if not n.startswith("upconv=")] + ups[:1]
    overrides = {k: v for n in levers if n in LEVERS for k, v in LEVERS[n].items()}
    flags = COMMAND_BUFFER_FLAGS if "command_buffers" in levers else ""
    return {"overrides": overrides, "xla_flags": flags, "levers": levers, "gain_ms": gain, "baseline_ms": base}


def table(records: list[dict], breakdowns: list[Path]) -> str:
    """The records as one table (step ms, samples/s, MFU, against the JAX baseline), then the step
    breakdowns side by side by kind of kernel."""
    base = next((r["step_ms_p50"] for r in records if r.get("label") == "jax baseline" and "step_ms_p50" in r), None)
    head = f"{'run':<34}{'step ms p50/p90':>17}{'samples/s':>11}{'MFU':>8}{'vs JAX base':>13}{'compile s':>11}"
    lines = [head, "-" * len(head)]
    for r in records:
        if "step_ms_p50" not in r:
            lines.append(f"{r['label'][:33]:<34}  {r.get('failure', 'no result')[:90]}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        delta = f"{r['step_ms_p50'] - base:+.2f} ms" if base else "-"
        lines.append(
            f"{r['label'][:33]:<34}{r['step_ms_p50']:>9.2f}/{r['step_ms_p90']:<7.2f}{r['samples_per_sec']:>11.1f}"
            f"{mfu:>8}{delta:>13}{r['compile_sec']:>11.1f}"
        )
    results = [json.loads((d / "breakdown.json").read_text()) for d in breakdowns if (d / "breakdown.json").exists()]
    names = [d.name.removeprefix("breakdown_") for d in breakdowns if (d / "breakdown.json").exists()]
    if results:
        lines += ["", f"{'step breakdown, ms per step':<34}" + "".join(f"{n[:14]:>16}" for n in names)]
        for title, key in [("convolutions", "conv_ms"), ("all other", "other_ms"), ("span", "span_ms")]:
            lines.append(f"{title:<34}" + "".join(f"{res['totals'][key]:>16.2f}" for res in results))
        kinds = sorted(
            {k for res in results for k in res["kinds"]}, key=lambda k: -results[0]["kinds"].get(k, {}).get("ms", 0)
        )
        for kind in kinds:
            ms = [res["kinds"].get(kind, {}).get("ms", 0.0) for res in results]
            if any(ms):
                lines.append(f"  {kind[:32]:<32}" + "".join(f"{v:>16.2f}" for v in ms))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="levers.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure variants, one after another, in this process")
    config_cli.add_config_args(r)
    r.add_argument("--framework", choices=("jax", "tf"), default="jax")
    r.add_argument("--variants", nargs="+", required=True)
    r.add_argument("--best", help="the combination written by `choose` (for variant best)")
    r.add_argument("--breakdown", nargs="*", default=[], help="VARIANT=DIR: trace that variant's step (JAX) into DIR")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=30)
    r.add_argument("--windows", type=int, default=3)
    r.add_argument("--out", required=True, help="JSON-lines file the records are appended to")
    r.add_argument("--deadline", type=float, help="skip a variant that would end after this time (s since the epoch)")
    r.add_argument("--estimate", type=float, default=40.0, help="seconds one variant takes, for --deadline")
    c = sub.add_parser("choose", help="the combination of the levers that helped, as JSON")
    c.add_argument("records", nargs="+")
    c.add_argument("--out", required=True)
    t = sub.add_parser("table", help="print the records and breakdowns as one table")
    t.add_argument("records", nargs="+")
    t.add_argument("--breakdowns", nargs="*", default=[])
    args = p.parse_args(argv)
    if args.command == "run":
        return run(args)
    records = [rec for path in args.records for rec in read_records(Path(path))]
    if args.command == "choose":
        result = choose(records)
        write_atomic(Path(args.out), json.dumps(result, indent=1))
        print(json.dumps(result))
        return 0
    print(table(records, [Path(d) for d in args.breakdowns]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
