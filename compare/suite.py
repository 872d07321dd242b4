"""Run a named list of benchmarks, each in its own process, and print one table:
``python -m compare.suite h200-compute --out results/h200/compute.jsonl``.

One process per entry keeps frameworks and their device memory apart (JAX preallocates, TF and
torch cache). A failing entry is reported in the table and the suite goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from compare.benchmark import table
from shared_data.errors import UserError, run_cli

# (label, framework, modes, config, extra arguments[, extra environment])
SHORT = "short_opt"
SUITES: dict[str, list[tuple]] = {
    # CPU: the same rows on this machine, tiny net (TF, JAX side by side)
    "cpu": [
        ("tf lowmem", "tf", "io synthetic full", "cpu_default", []),
        ("jax lowmem", "jax", "io synthetic full", "cpu_default", []),
        ("tf dali-npy", "tf", "io full", "cpu_default", ["--data_loader_config", "dali-npy"]),
        ("jax dali-npy", "jax", "io full", "cpu_default", ["--data_loader_config", "dali-npy"]),
    ],
    # H200, call 1: compute (synthetic) for the PyTorch reference and the JAX variants
    "h200-compute": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 subpixel+s2d", "jax", "synthetic", SHORT, []),
        ("jax bf16 subpixel+s2d (cache warm)", "jax", "synthetic", SHORT, []),
        ("jax bf16 subpixel+strided", "jax", "synthetic", SHORT, ["--set", "downconv=strided"]),
        ("jax bf16 subpixel+s2d b128", "jax", "synthetic", SHORT, ["--global_batch_size", "128"]),
        ("jax fp32 subpixel+s2d", "jax", "synthetic", SHORT, ["--set", "enable_amp=false"]),
    ],
    # H200: the formulation per level (compare.layer_bench: plain strided / transposed convs are faster
    # at the small levels) and the GPU-resident DALI input, in one call
    "h200-levels": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 levels: strided<32, transpose<4", "jax", "synthetic", SHORT, []),
        ("jax bf16 s2d + subpixel everywhere", "jax", "synthetic", SHORT,
         ["--set", "downconv_strided_below=0", "--set", "upconv_transpose_below=0"]),
        ("jax bf16 levels: strided<32", "jax", "synthetic", SHORT, ["--set", "upconv_transpose_below=0"]),
        ("jax bf16 levels: transpose<4", "jax", "synthetic", SHORT, ["--set", "downconv_strided_below=0"]),
        ("jax dali-device", "jax", "io full", SHORT, ["--data_loader_config", "dali-device"]),
    ],
    # H200: XLA flags for the convolutions (cuDNN runtime-compiled conv + bias + activation fusions;
    # NHWC forced for every cuDNN conv), against the reference in the same call
    "h200-flags": [
        ("jax bf16 default flags", "jax", "synthetic", SHORT, []),
        ("jax bf16 + cuDNN runtime fusion", "jax", "synthetic", SHORT, [], {"XLA_FLAGS": "--xla_gpu_use_runtime_fusion=true"}),
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 + force conv NHWC", "jax", "synthetic", SHORT, [], {"XLA_FLAGS": "--xla_gpu_force_conv_nhwc=true"}),
    ],
    # H200: IO of the other loaders (the comparison call runs dali-device and the device loader)
    "h200-loaders": [
        ("jax dali-npy 16 threads", "jax", "io", SHORT, ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"]),
        ("jax dali-h5 simple", "jax", "io", SHORT, ["--data_loader_config", "dali-h5", "--set", "dali_h5_mode=simple"]),
        ("jax lowmem 8 workers", "jax", "io", SHORT, ["--data_loader_config", "lowmem", "--num_data_workers", "8"]),
        ("jax inmem 8 workers", "jax", "io", SHORT, ["--data_loader_config", "inmem", "--num_data_workers", "8"]),
        ("jax synthetic 8 workers", "jax", "io", SHORT, ["--data_loader_config", "synthetic", "--num_data_workers", "8"]),
    ],
    # H200, final call: the reference and JAX with the kit's defaults (XLA flags of shared_data.xla_flags)
    # side by side: SYNTHETIC, warm-cache compile, FULL with the device loader and with dali-device
    "h200-final": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16", "jax", "synthetic", SHORT, []),
        ("jax bf16 (cache warm)", "jax", "synthetic", SHORT, []),
        ("jax device loader", "jax", "io full", SHORT, ["--data_loader_config", "device"]),
        ("jax dali-device", "jax", "io full", SHORT, ["--data_loader_config", "dali-device"]),
        ("jax bf16 without NHWC flag", "jax", "synthetic", SHORT, [], {"XLA_FLAGS": "--xla_gpu_force_conv_nhwc=false"}),
    ],
    # H200, call 2: input pipelines (IO) and full training
    "h200-input": [
        ("jax device loader", "jax", "io full", SHORT, ["--data_loader_config", "device"]),
        ("jax dali-npy 8 threads", "jax", "io", SHORT, ["--data_loader_config", "dali-npy", "--set", "dali_threads=8"]),
        ("jax dali-npy 16 threads", "jax", "io full", SHORT, ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"]),
        ("jax dali-h5 parallel 16", "jax", "io", SHORT, ["--data_loader_config", "dali-h5", "--num_data_workers", "16", "--set", "dali_threads=8"]),
        ("jax dali-h5 prefetch", "jax", "io", SHORT, ["--data_loader_config", "dali-h5", "--set", "dali_h5_mode=prefetch", "--set", "dali_threads=8"]),
        ("jax inmem 8 threads", "jax", "io", SHORT, ["--data_loader_config", "inmem", "--num_data_workers", "8"]),
        ("torch dali-npy 16 threads", "torch", "full", SHORT, ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"]),
    ],
}


def run_suite(name: str, out: Path, extra: Sequence[str] = (), timeout: int = 600) -> list[dict]:
    """Run every entry of suite ``name``; append results to ``out`` (JSON lines); return them."""
    if name not in SUITES:
        raise UserError(f"suite {name!r}: expected one of {', '.join(SUITES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for label, framework, modes, config, args, *env in SUITES[name]:
        cmd = [sys.executable, "-m", "compare.benchmark", "--framework", framework, "--mode", *modes.split(),
               "--config", config, "--label", label, "--out", str(out), *args, *extra]
        environ = {**os.environ, **(env[0] if env else {})}
        print(f"[suite] {label}: {' '.join(cmd[1:])} {env[0] if env else ''}", flush=True)
        before = out.read_text().count("\n") if out.exists() else 0
        t0 = time.perf_counter()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
            ok = res.returncode == 0
            tail = (res.stdout + res.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            ok, tail = False, f"timed out after {timeout} s"
        lines = out.read_text().splitlines()[before:] if out.exists() else []
        records += [json.loads(line) for line in lines]
        print(f"[suite] {label}: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
        if not ok:
            print(tail, flush=True)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.suite", description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--out", required=True, help="JSON lines file the results are appended to")
    p.add_argument("--timeout", type=int, default=600, help="seconds per entry")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="arguments added to every entry")
    args = p.parse_args(argv)
    records = run_suite(args.suite, Path(args.out), args.extra, args.timeout)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
