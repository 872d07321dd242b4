"""Every TF trainer path a user runs on a GPU, run: each loader in bf16, the device loader in fp16,
fp32 and without XLA, and the same for JAX's trainer where a row has a JAX twin; runs go in parallel
(``--parallel`` processes, TF_FORCE_GPU_ALLOW_GROWTH so they share the GPU). A row is its command,
exit code, epoch losses and samples/s; JSON lines to ``--out``, a table printed last.

    python experiments/tf_on_h200/trainers.py --out $OUT/trainers.jsonl --workdir /tmp/tfruns
    python experiments/tf_on_h200/trainers.py --config cpu_tiny --set train_path=... --set val_path=... (CPU smoke)
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from shared_data.runtime.records import read_metrics

LOADERS = ("inmem", "lowmem", "device", "dali-npy", "dali-h5", "dali-device")
# (label, framework, extra flags): bf16 with every loader, then precision and XLA on the device loader
ROWS = [(f"bf16 {loader}", "tf", ["--enable_amp", "--data_loader_config", loader]) for loader in LOADERS] + [
    ("fp16 device", "tf", ["--enable_amp", "--amp_dtype", "float16", "--data_loader_config", "device"]),
    ("fp32 device", "tf", ["--no-enable_amp", "--data_loader_config", "device"]),
    ("bf16 device, XLA off", "tf", ["--enable_amp", "--no-enable_jit", "--data_loader_config", "device"]),
    ("bf16 device", "jax", ["--enable_amp", "--data_loader_config", "device"]),
    ("fp16 device", "jax", ["--enable_amp", "--amp_dtype", "float16", "--data_loader_config", "device"]),
]


def run_row(label: str, framework: str, flags: list[str], common: list[str], workdir: Path, timeout: float) -> dict:
    folder = workdir / f"{framework}_{label.replace(' ', '_').replace(',', '')}"
    cmd = [sys.executable, "-m", f"{framework}_impl.train", *common, *flags, "--workdir", str(folder), "--overwrite"]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        code, tail = res.returncode, (res.stderr + res.stdout)[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = "timeout", ""
    hist = read_metrics(folder) if folder.exists() else []
    return {
        "label": label,
        "framework": framework,
        "exit": code,
        "wall_sec": time.perf_counter() - t0,
        "train_loss": [h["train_loss"] for h in hist],
        "val_loss": [h["val_loss"] for h in hist],
        "samples_per_sec": hist[-1]["samples_per_sec"] if hist else None,
        "compile_sec": hist[-1].get("compile_sec") if hist else None,
        "command": " ".join(cmd),
        "tail": tail if code != 0 else "",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="short")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--epochs", default="2")
    p.add_argument("--nsamples", default="2048")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--workdir", default="/tmp/trainer_rows")
    p.add_argument("--out")
    p.add_argument("--rows", nargs="+", help="only the TF rows with these labels (default: every row)")
    args = p.parse_args()
    common = ["--config", args.config, "--num_epochs", args.epochs, "--set", f"Nsamples={args.nsamples}"]
    common += [a for s in args.set for a in ("--set", s)] + ["--set", "progress_bar=false"]
    env_note = {k: os.environ.get(k) for k in ("TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_MEM_FRACTION")}
    with cf.ThreadPoolExecutor(args.parallel) as pool:
        futures = [
            pool.submit(run_row, label, fw, flags, common, Path(args.workdir), args.timeout)
            for label, fw, flags in ROWS
            if not args.rows or (fw == "tf" and label in args.rows)
        ]
        rows = [f.result() for f in futures]
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps({**r, "env": env_note}) + "\n" for r in rows)
    print(
        f"{'row':<24}{'fw':<5}{'exit':>5}{'train loss per epoch':>32}{'val loss':>11}{'samples/s':>11}{'compile s':>10}"
    )
    for r in rows:
        tl = ", ".join(f"{v:.5f}" for v in r["train_loss"]) or "-"
        vl = f"{r['val_loss'][-1]:.5f}" if r["val_loss"] else "-"
        sps = f"{r['samples_per_sec']:.1f}" if r["samples_per_sec"] else "-"
        cs = f"{r['compile_sec']:.1f}" if r["compile_sec"] else "-"
        print(f"{r['label']:<24}{r['framework']:<5}{r['exit']!s:>5}{tl:>32}{vl:>11}{sps:>11}{cs:>10}")
        if r["tail"]:
            print("   ", r["tail"].strip().splitlines()[-1][:200])


if __name__ == "__main__":
    main()
