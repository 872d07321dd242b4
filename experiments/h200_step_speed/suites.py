"""The benchmark suites of this study, each one device call (``dlas_compare.suite.run_suite`` runs the
entries, one process each, and prints one table):

    PYTHONPATH=. python3 experiments/h200_step_speed/suites.py h200-final --out $OUT/final.jsonl
"""

import argparse
import sys
from pathlib import Path

from dlas_compare.benchmark import table
from dlas_compare.suite import run_suite
from shared_data.core.errors import run_cli

SHORT = "short_opt"
# (label, framework, modes, config, extra arguments[, extra environment])
SUITES: dict[str, list[tuple]] = {
    # H200, call 1: compute (synthetic) for the PyTorch reference and the JAX variants
    "h200-compute": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 subpixel+s2d", "jax", "synthetic", SHORT, []),
        ("jax bf16 subpixel+s2d (cache warm)", "jax", "synthetic", SHORT, []),
        ("jax bf16 subpixel+strided", "jax", "synthetic", SHORT, ["--set", "downconv=strided"]),
        ("jax bf16 subpixel+s2d b128", "jax", "synthetic", SHORT, ["--global_batch_size", "128"]),
        ("jax fp32 subpixel+s2d", "jax", "synthetic", SHORT, ["--set", "enable_amp=false"]),
    ],
    # H200: the formulation per level (dlas_compare.layer_bench: plain strided / transposed convs are faster
    # at the small levels) and the GPU-resident DALI input, in one call
    "h200-levels": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 levels: strided<32, transpose<4", "jax", "synthetic", SHORT, []),
        (
            "jax bf16 s2d + subpixel everywhere",
            "jax",
            "synthetic",
            SHORT,
            ["--set", "downconv_strided_below=0", "--set", "upconv_transpose_below=0"],
        ),
        ("jax bf16 levels: strided<32", "jax", "synthetic", SHORT, ["--set", "upconv_transpose_below=0"]),
        ("jax bf16 levels: transpose<4", "jax", "synthetic", SHORT, ["--set", "downconv_strided_below=0"]),
        ("jax dali-device", "jax", "io full", SHORT, ["--data_loader_config", "dali-device"]),
    ],
    # H200: XLA flags for the convolutions (cuDNN runtime-compiled conv + bias + activation fusions;
    # NHWC forced for every cuDNN conv), against the reference in the same call
    "h200-flags": [
        ("jax bf16 default flags", "jax", "synthetic", SHORT, []),
        (
            "jax bf16 + cuDNN runtime fusion",
            "jax",
            "synthetic",
            SHORT,
            [],
            {"XLA_FLAGS": "--xla_gpu_use_runtime_fusion=true"},
        ),
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16 + force conv NHWC", "jax", "synthetic", SHORT, [], {"XLA_FLAGS": "--xla_gpu_force_conv_nhwc=true"}),
    ],
    # H200: IO of the other loaders (the comparison call runs dali-device and the device loader)
    "h200-loaders": [
        (
            "jax dali-npy 16 threads",
            "jax",
            "io",
            SHORT,
            ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"],
        ),
        ("jax dali-h5 simple", "jax", "io", SHORT, ["--data_loader_config", "dali-h5", "--set", "dali_h5_mode=simple"]),
        ("jax lowmem 8 workers", "jax", "io", SHORT, ["--data_loader_config", "lowmem", "--num_data_workers", "8"]),
        ("jax inmem 8 workers", "jax", "io", SHORT, ["--data_loader_config", "inmem", "--num_data_workers", "8"]),
        (
            "jax synthetic 8 workers",
            "jax",
            "io",
            SHORT,
            ["--data_loader_config", "synthetic", "--num_data_workers", "8"],
        ),
    ],
    # H200, final call: the reference and JAX with the kit's defaults (XLA flags of shared_data.runtime.xla_flags)
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
        (
            "jax dali-npy 16 threads",
            "jax",
            "io full",
            SHORT,
            ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"],
        ),
        (
            "jax dali-h5 parallel 16",
            "jax",
            "io",
            SHORT,
            ["--data_loader_config", "dali-h5", "--num_data_workers", "16", "--set", "dali_threads=8"],
        ),
        (
            "jax dali-h5 prefetch",
            "jax",
            "io",
            SHORT,
            ["--data_loader_config", "dali-h5", "--set", "dali_h5_mode=prefetch", "--set", "dali_threads=8"],
        ),
        ("jax inmem 8 threads", "jax", "io", SHORT, ["--data_loader_config", "inmem", "--num_data_workers", "8"]),
        (
            "torch dali-npy 16 threads",
            "torch",
            "full",
            SHORT,
            ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"],
        ),
    ],
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments/h200_step_speed/suites.py", description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args(argv)
    print(table(run_suite(SUITES[args.suite], Path(args.out), timeout=args.timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
