"""Per-layer forward + backward time of the U-Net's convolutions, JAX formulations against PyTorch.

Answers "which layers make the step slow, and which formulation is fastest for each": for every layer
of ``layer_specs(cfg)`` at the local batch size, in the compute precision of ``cfg``, it times one
forward pass and the gradients with respect to input and kernel (what a training step runs per layer;
bias and activation are left out) for each JAX formulation (``downconv``: space_to_depth, strided;
``upconv``: subpixel, phases, transpose) and for PyTorch's ``Conv3d`` / ``ConvTranspose3d`` with the
tutorial's practices (bf16 autocast, ``channels_last_3d``, ``cudnn.benchmark``) when torch and a GPU
are present. Timing: warm-up, then the median of ``windows`` windows of ``steps`` calls, synchronised
at window ends (``block_until_ready`` / ``torch.cuda.synchronize``).

Usage::

    python -m dlas_compare.layer_bench --config short_opt --out results/layers.jsonl
    python -m dlas_compare.layer_bench --config cpu_tiny --local_batch_size 2 --no-torch     # CPU smoke run

Prints one table last: ms per layer and formulation, and TFLOP/s on the layer's model FLOPs
(3 x the dense forward count of :func:`shared_data.model.unet_spec.forward_flops`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

from dlas_compare.benchmark import int_at_least
from dlas_compare.benchmark_timing import timed_windows
from shared_data.core.commands import make_parser
from shared_data.core.config_cli import add_config_args, config_from_args
from shared_data.core.errors import UserError, run_cli
from shared_data.model.unet_spec import KERNEL, LayerSpec, layer_specs

JAX_METHODS = {"down": ("space_to_depth", "strided"), "up": ("subpixel", "phases", "transpose")}


def layer_model_flops(s: LayerSpec, batch: int) -> float:
    """Training FLOPs of layer ``s`` for ``batch`` samples: 3 x dense forward MACs x 2."""
    m = s.out_size if s.kind == "down" else s.in_size
    return 3 * 2.0 * batch * m**3 * KERNEL**3 * s.c_in * s.c_out


def jax_layer_fn(s: LayerSpec, method: str, batch: int, dtype_name: str):
    """A jitted fwd+bwd of layer ``s`` by ``method`` and its inputs: returns ``call() -> grads``."""
    import jax
    import jax.numpy as jnp

    from jax_impl import model as model_mod

    dtype = model_mod.COMPUTE_DTYPES[dtype_name]
    conv = (model_mod.DOWNCONV if s.kind == "down" else model_mod.UPCONV)[method]
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (batch, s.in_size, s.in_size, s.in_size, s.c_in), jnp.float32).astype(dtype)
    w = 0.02 * jax.random.normal(kw, (KERNEL, KERNEL, KERNEL, s.c_in, s.c_out), jnp.float32)
    g = jax.random.normal(kg, (batch, s.out_size, s.out_size, s.out_size, s.c_out), jnp.float32).astype(dtype)

    @jax.jit
    def fwd_bwd(x, w, g):
        out, vjp = jax.vjp(lambda x, w: conv(x, w.astype(dtype)), x, w)
        return vjp(g)

    return lambda: fwd_bwd(x, w, g), lambda out: jax.block_until_ready(out)


def torch_layer_fn(s: LayerSpec, batch: int, dtype_name: str):
    """The same fwd+bwd with PyTorch's layer (channels_last_3d, autocast) on the GPU."""
    import torch

    torch.backends.cudnn.benchmark = True
    conv = (torch.nn.Conv3d if s.kind == "down" else torch.nn.ConvTranspose3d)(s.c_in, s.c_out, 4, 2, 1)
    conv = conv.cuda().to(memory_format=torch.channels_last_3d)
    x = torch.randn(batch, s.c_in, s.in_size, s.in_size, s.in_size, device="cuda")
    x = x.to(memory_format=torch.channels_last_3d).requires_grad_(True)
    g = torch.randn(batch, s.c_out, s.out_size, s.out_size, s.out_size, device="cuda")
    g = g.to(memory_format=torch.channels_last_3d)
    amp = dtype_name != "float32"
    dt = getattr(torch, dtype_name) if amp else None

    def call():
        with torch.autocast("cuda", dtype=dt, enabled=amp):
            y = conv(x)
        y.backward(g.to(y.dtype))
        return y

    return call, lambda out: torch.cuda.synchronize()


def torch_on_gpu() -> bool:
    """Whether torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("dlas_compare.layer_bench", __doc__.split("\n\n")[0])
    add_config_args(p)
    p.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed calls per variant (>= 0)")
    p.add_argument("--steps", type=int_at_least(1), default=10, help="calls per timed window (>= 1)")
    p.add_argument("--windows", type=int_at_least(1), default=3, help="timed windows, median taken (>= 1)")
    p.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    p.add_argument("--no-torch", dest="torch", action="store_false", help="skip the PyTorch column")
    p.add_argument("--out", default=None, help="append one JSON line per layer and formulation")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    batch = cfg.local_batch_size or cfg.global_batch_size  # samples per layer call
    specs = layer_specs(cfg)
    if args.layers:
        wanted = set(args.layers.split(","))
        unknown = wanted - {s.name for s in specs}
        if unknown:
            raise UserError(f"--layers: unknown layer(s) {sorted(unknown)}; the net has {[s.name for s in specs]}")
        specs = [s for s in specs if s.name in wanted]
    with_torch = args.torch and torch_on_gpu()
    if args.torch and not with_torch:
        print("no PyTorch column: torch or a CUDA device is missing", flush=True)
    rows = []
    for s in specs:
        variants = [("jax " + m, lambda m=m: jax_layer_fn(s, m, batch, cfg.precision)) for m in JAX_METHODS[s.kind]]
        if with_torch:
            variants.append(("torch", lambda: torch_layer_fn(s, batch, cfg.precision)))
        for label, make in variants:
            call, sync = make()
            t0 = time.perf_counter()
            sync(call())
            first_s = time.perf_counter() - t0
            ms = 1e3 * statistics.median(timed_windows(call, sync, args.warmup, args.steps, args.windows)[1])
            row = {
                "layer": s.name,
                "kind": s.kind,
                "c_in": s.c_in,
                "c_out": s.c_out,
                "in_size": s.in_size,
                "batch": batch,
                "precision": cfg.precision,
                "variant": label,
                "ms": ms,
                "first_call_s": first_s,
                "tflops": layer_model_flops(s, batch) / (ms * 1e-3) / 1e12,
                "config": cfg.name,
            }
            rows.append(row)
            print(f"{s.name:6s} {label:22s} {ms:8.3f} ms  {row['tflops']:9.4f} TFLOP/s", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    print(f"ms per forward + backward (input and kernel gradients), batch {batch}, {cfg.precision}:")
    print(table(rows))
    return 0


def table(rows: list[dict]) -> str:
    """Layers as rows, formulations as columns (ms); last columns: the fastest JAX formulation and
    its time over PyTorch's. The ``sum`` row adds the layers each column has (down or up only)."""
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    ms = {(r["layer"], r["variant"]): r["ms"] for r in rows}
    lines = [f"{'layer':6s} " + " ".join(f"{lab:>18s}" for lab in labels) + f"   {'fastest jax':>14s} {'/torch':>5s}"]
    totals = dict.fromkeys(labels, 0.0)
    best_total = 0.0
    for name in layers:
        cells, jax_best = [], None
        for lab in labels:
            v = ms.get((name, lab))
            cells.append(f"{v:18.3f}" if v is not None else f"{'-':>18s}")
            if v is not None:
                totals[lab] += v
                if lab.startswith("jax") and (jax_best is None or v < jax_best[1]):
                    jax_best = (lab, v)
        best_total += jax_best[1]
        torch_ms = ms.get((name, "torch"))
        ratio = f"{jax_best[1] / torch_ms:5.2f}" if torch_ms else "  -  "
        lines.append(f"{name:6s} " + " ".join(cells) + f"   {jax_best[0][4:]:>14s} {ratio}")
    lines.append(
        f"{'sum':6s} " + " ".join(f"{totals[lab]:18.3f}" for lab in labels) + f"   best-of sum {best_total:.3f} ms"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
