"""Where the time of one JAX training step goes: per layer, the forward, input-gradient and
weight-gradient convolutions with their achieved TFLOP/s against the peak; the rest by kind (bias and
activations, pads, concatenations, depth-to-space shuffles, casts, loss, Adam, ...), each with the
bytes it moves against the copy rate.

    python -m dlas_compare.step_breakdown --config short_opt --out runs/breakdown       # bf16 (short_opt)
    python -m dlas_compare.step_breakdown --config short_opt --no-enable_amp --out runs/breakdown_fp32
    python -m dlas_compare.step_breakdown --from_dir runs/breakdown                     # re-read a saved trace

How: ``--steps`` SYNTHETIC steps of the kit's compiled train step are traced with
``jax.profiler.trace`` (a Perfetto trace); every kernel event names the HLO instruction it runs
(``hlo_op``), and the optimized HLO of the step (``Compiled.as_text()``) gives each instruction's
shapes, convolution window and the Python source (function names) it came from. Convolutions are
``convolution`` ops or cuDNN custom-calls; their executed FLOPs are ``2 x elements(forward output) x
elements(kernel) / C_out`` (each output element is a dot product over the kernel's window and input
channels). The bytes of any other op are its operands plus its result, read and written once.
Writes ``trace.json.gz``, ``hlo.txt``, ``breakdown.json`` (atomically) into ``--out`` and prints the
tables. JAX only. The reading of the HLO (instructions, convolutions' FLOPs, roles and layers, the
kinds of the other ops) is :mod:`dlas_compare.step_breakdown_hlo`; this module times and traces the
steps, attributes the trace's kernels and prints the tables.
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from dlas_compare import peaks
from dlas_compare.benchmark_timing import waiting
from dlas_compare.step_breakdown_hlo import (
    KINDS,
    computations,
    conv_flops_and_role,
    formulation_kernels,
    is_conv,
    kind_of,
    layer_of,
    nbytes,
    parse_hlo,
)
from shared_data.core import config as config_mod
from shared_data.core import config_checks, config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import write_atomic
from shared_data.model import unet_spec
from shared_data.runtime import sizing

#: Copy rate (bytes read + written per second) the memory-bound ops are measured against, by device.
PEAK_COPY_TBPS = {"H200": 4.3, "H100": 2.9}


def kernel_times(events: list, steps: int, instructions: dict | None = None) -> tuple[dict, dict]:
    """Per HLO instruction, the kernel seconds per step, and the device totals (``busy_s``: the union of
    kernel intervals, ``span_s``: first start to last end, both per step). Device (GPU) kernel events
    are used when the trace has them, else the host's XLA thunk events (CPU). A kernel run inside an
    XLA command buffer (a CUDA graph) names the buffer as its ``hlo_op``; its own name is its fusion's
    with ``.`` written ``_`` (``loop_add_fusion_3`` for ``loop_add_fusion.3``), which ``instructions``
    (:func:`parse_hlo`) maps back."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu = {pid for pid, n in names.items() if "GPU" in n or "/device:" in n}
    ops = [
        e
        for e in events
        if e.get("ph") == "X"
        and isinstance(e.get("args"), dict)
        and "hlo_op" in e["args"]
        and (e["pid"] in gpu if gpu else not e["name"].startswith("end:"))
    ]
    if not ops:
        raise UserError("the trace has no kernel events naming an HLO instruction (hlo_op); nothing to attribute")
    by_kernel_name = {name.replace(".", "_"): name for name in instructions or {}}
    per_op = collections.defaultdict(float)
    for e in ops:
        op = e["args"]["hlo_op"]
        if instructions is not None and op not in instructions:
            op = by_kernel_name.get(e["name"], op)
        per_op[op] += e["dur"] * 1e-6 / steps
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in ops)
    busy, end = 0.0, -math.inf
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return dict(per_op), {"busy_s": busy * 1e-6 / steps, "span_s": (spans[-1][1] - spans[0][0]) * 1e-6 / steps}


def breakdown(hlo_text: str, events: list, steps: int, cfg, batch: int, device: str) -> dict:
    """The breakdown of one step from its HLO and trace: ``layers`` (per layer and role: ms, GFLOP,
    TFLOP/s, share of the datasheet peak), ``kinds`` (per kind: ms, GB moved, TB/s, share of the copy rate),
    ``totals``."""
    instrs, comps = parse_hlo(hlo_text), computations(hlo_text)
    per_op, totals = kernel_times(events, steps, instrs)
    layers_names = [s.name for s in unet_spec.layer_specs(cfg)]
    peak = peaks.datasheet_tflops(device, cfg.precision)
    copy = next((v for k, v in PEAK_COPY_TBPS.items() if k in device), None)
    kernels = formulation_kernels(cfg)
    layers = {
        n: {r: {"ms": 0.0, "gflop": 0.0} for r in ("fwd", "dgrad", "wgrad")} for n in [*layers_names, "unidentified"]
    }
    kinds = {k: {"ms": 0.0, "gb": 0.0} for k in KINDS}
    unmatched = 0.0
    for name, seconds in per_op.items():
        ins = instrs.get(name)
        if ins is None:
            unmatched += seconds
            continue
        fused = [instrs[n] for n in comps.get(ins.calls or "", []) if n in instrs]
        conv = ins if is_conv(ins) else next((f for f in fused if is_conv(f)), None)
        layer = layer_of(conv, layers_names) if conv else None
        if conv is not None and layer is None:  # no scope: the layer whose kernel has these dims, if one
            dims = sorted(next(d for t, d in conv.shapes if t != "u8"))
            match = [n for n, k in kernels.items() if k == dims]
            layer = match[0] if len(match) == 1 else "unidentified"
        if conv is not None:
            flops, role = conv_flops_and_role(conv, instrs, batch)
            layers[layer][role]["ms"] += seconds * 1e3
            layers[layer][role]["gflop"] += flops / 1e9
            continue
        kind = kind_of(ins, fused)
        operand_bytes = sum(nbytes([s for s in instrs[o].shapes if s[0] != "u8"]) for o in ins.operands if o in instrs)
        kinds[kind]["ms"] += seconds * 1e3
        kinds[kind]["gb"] += (operand_bytes + nbytes([s for s in ins.shapes if s[0] != "u8"])) / 1e9
    for row in (r for lay in layers.values() for r in lay.values()):
        row["tflops"] = row["gflop"] / row["ms"] if row["ms"] else 0.0
        row["peak_share"] = row["tflops"] / peak if peak else None
    for row in kinds.values():
        row["tbps"] = row["gb"] / row["ms"] if row["ms"] else 0.0
        row["copy_share"] = row["tbps"] / copy if copy else None
    conv_ms = sum(r["ms"] for lay in layers.values() for r in lay.values())
    conv_gflop = sum(r["gflop"] for lay in layers.values() for r in lay.values())
    model_gflop = unet_spec.train_flops_per_sample(cfg) * batch / 1e9
    totals.update(
        kernel_ms=sum(per_op.values()) * 1e3,
        conv_ms=conv_ms,
        other_ms=sum(k["ms"] for k in kinds.values()),
        unmatched_ms=unmatched * 1e3,
        conv_gflop_executed=conv_gflop,
        model_gflop=model_gflop,
        floor_ms_at_peak=model_gflop / peak if peak else None,
        busy_ms=totals.pop("busy_s") * 1e3,
        span_ms=totals.pop("span_s") * 1e3,
    )
    span = totals["span_ms"] / 1e3
    totals.update(peaks.utilisation(model_gflop * 1e9 / batch, batch / span, device, cfg.precision) if span else {})
    return {
        "layers": layers,
        "kinds": kinds,
        "totals": totals,
        "device": device,
        "peak_tflops": peak,
        "copy_tbps": copy,
        "batch": batch,
        "precision": cfg.precision,
        "config": cfg.name,
    }


#: What a breakdown traced on a CPU measures (printed above its tables, which then leave out TFLOP/s).
CPU_NOTE = (
    "note: a CPU trace. XLA's CPU runtime runs these operations on several threads at once and records "
    "some of them as their dispatch only, so their times overlap (they add up to {kernel_ms:.2f} ms in a "
    "{span_ms:.2f} ms step) and a convolution's time is not its compute: no TFLOP/s. Times are shares of "
    "a CPU step; the breakdown of a GPU step comes from a GPU trace (--from_dir re-reads one)."
)


def on_gpu(device: str) -> bool:
    """Whether ``device`` (the benchmark's ``"N x <kind>"``) names a GPU rather than a CPU."""
    return "cpu" not in device.lower()


def tables(result: dict) -> str:
    """The two tables of a breakdown as Markdown (ms per step)."""
    t = result["totals"]
    gpu = on_gpu(result["device"])
    lines = [
        f"{result['config']}, {result['precision']}, batch {result['batch']}, {result['device']}: "
        f"span {t['span_ms']:.2f} ms per step, kernels busy {t['busy_ms']:.2f} ms, convolutions "
        f"{t['conv_ms']:.2f} ms, other {t['other_ms']:.2f} ms",
    ]
    if not gpu:
        lines.append(CPU_NOTE.format(kernel_ms=t["kernel_ms"], span_ms=t["span_ms"]))
    lines += [
        "",
        "| layer | fwd ms | dgrad ms | wgrad ms | GFLOP executed | TFLOP/s | % of datasheet peak |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, roles in result["layers"].items():
        ms = sum(r["ms"] for r in roles.values())
        if name == "unidentified" and not ms:
            continue
        gflop = sum(r["gflop"] for r in roles.values())
        share = f"{100 * gflop / ms / result['peak_tflops']:.0f}%" if ms and result["peak_tflops"] else "-"
        rate = f"{gflop / ms if ms else 0:.3g}" if gpu else "-"
        lines.append(
            f"| {name} | {roles['fwd']['ms']:.2f} | {roles['dgrad']['ms']:.2f} | {roles['wgrad']['ms']:.2f} | "
            f"{gflop:.3g} | {rate} | {share} |"
        )
    lines += ["", "| other kernels, by kind | ms | GB moved | TB/s | % of copy rate |", "|---|---|---|---|---|"]
    for kind, row in sorted(result["kinds"].items(), key=lambda kv: -kv[1]["ms"]):
        if row["ms"]:
            share = f"{100 * row['copy_share']:.0f}%" if row["copy_share"] is not None else "-"
            lines.append(f"| {kind} | {row['ms']:.2f} | {row['gb']:.2f} | {row['tbps']:.2f} | {share} |")
    if t["floor_ms_at_peak"]:
        lines.append(
            f"\nmodel FLOPs {t['model_gflop']:.0f} GFLOP per step: {t['floor_ms_at_peak']:.2f} ms at "
            f"{result['peak_tflops']:.1f} TFLOP/s (datasheet, dense); executed convolution FLOPs "
            f"{t['conv_gflop_executed']:.0f} GFLOP"
        )
    if t.get("mfu"):
        of_matmul = t.get("mfu_of_measured_matmul")
        lines.append(
            f"MFU over the traced step's span: {100 * t['mfu']:.1f}% of the datasheet peak"
            + (f", {100 * of_matmul:.1f}% of the measured matmul rate" if of_matmul else "")
        )
    return "\n".join(lines)


def trace_steps(cfg, steps: int, warmup: int, out: Path) -> tuple[str, list, str, float]:
    """Trace ``steps`` SYNTHETIC steps of the kit's JAX step; return (HLO text, trace events, device, step seconds)."""
    from jax_impl.bench import Bench

    return trace_bench(Bench(cfg, "synthetic"), steps, warmup, out)


def say(line: str) -> None:
    """Say on stderr what the breakdown is doing (a large config's steps take minutes on a CPU)."""
    print(f"[breakdown] {line}", file=sys.stderr, flush=True)


def trace_bench(bench, steps: int, warmup: int, out: Path) -> tuple[str, list, str, float]:
    """:func:`trace_steps` of a compiled SYNTHETIC ``jax_impl.bench.Bench``: ``warmup`` steps, ``steps``
    timed untraced steps, then ``steps`` traced ones; the trace and the optimized HLO are written to ``out``."""
    import tempfile
    import time

    import jax

    say(f"step compiled; {warmup} warm-up steps")
    with waiting(say, f"warm-up: waiting for its {warmup} step(s)"):  # minutes a step on a CPU
        for _ in range(warmup):
            bench.step()
        bench.sync()
    say(f"{steps} timed steps")
    with waiting(say, f"timed steps: waiting for its {steps} step(s)"):
        t0 = time.perf_counter()
        for _ in range(steps):
            bench.step()
        bench.sync()
        step_s = (time.perf_counter() - t0) / steps
    say(f"{step_s:.3g} s per step; {steps} traced steps")
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(steps):
                bench.step()
            bench.sync()
        trace = sorted(Path(tmp).glob("plugins/profile/*/perfetto_trace.json.gz"))[-1]
        raw = trace.read_bytes()
    write_atomic(out / "trace.json.gz", raw)
    hlo = bench.train_fn.as_text()
    write_atomic(out / "hlo.txt", hlo)
    return hlo, json.loads(gzip.decompress(raw))["traceEvents"], bench.device_name(), step_s


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.step_breakdown", __doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--steps", type=int, default=5, help="traced steps (after the timed ones)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, autotuning)")
    p.add_argument("--out", help="folder for trace.json.gz, hlo.txt and breakdown.json")
    p.add_argument("--from_dir", help="re-read the trace and HLO (hlo.txt or hlo.txt.gz) saved in this folder")
    args = p.parse_args(argv)
    if args.from_dir:
        folder = Path(args.from_dir)
        meta = json.loads((folder / "breakdown.json").read_text())
        cfg = config_checks.make_config(meta["config_values"], meta["config"], str(folder / "breakdown.json"))
        hlo_file = folder / "hlo.txt"
        hlo = (
            hlo_file.read_text()
            if hlo_file.is_file()
            else gzip.decompress((folder / "hlo.txt.gz").read_bytes()).decode()
        )
        events = json.loads(gzip.decompress((folder / "trace.json.gz").read_bytes()))["traceEvents"]
        device, step_s, steps = meta["device"], meta["step_s"], meta["steps"]
    else:
        if not args.out:
            raise UserError("--out: give a folder for the trace and the breakdown (or --from_dir to re-read one)")
        cfg = config_cli.config_from_args(args)
        folder, steps = Path(args.out), args.steps
        warning = sizing.oversized_warning(cfg, 1 + args.warmup + 2 * steps, "the breakdown")
        if warning:
            say(f"warning: {warning}")
        say(f"compiling the JAX train step of {cfg.name!r}")
        folder.mkdir(parents=True, exist_ok=True)
        hlo, events, device, step_s = trace_steps(cfg, steps, args.warmup, folder)
    batch = config_mod.batch_sizes(cfg, 1)[0]
    result = breakdown(hlo, events, steps, cfg, batch, device)
    result.update(step_s=step_s, steps=steps, config_values=config_mod.config_dict(cfg), samples_per_sec=batch / step_s)
    write_atomic(folder / "breakdown.json", json.dumps(result, indent=1))
    print(tables(result))
    print(f"\ntimed step (untraced): {1e3 * step_s:.2f} ms, {batch / step_s:.1f} samples/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
