"""Run a named list of benchmarks, each in its own process, and print one table:
``python -m dlas_compare.suite gpu --out results/gpu/compare.jsonl``.

One process per entry keeps frameworks and their device memory apart (JAX preallocates, TF and
torch cache). A failing entry is reported in the table and the suite goes on.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from dlas_compare.benchmark import run_process, table
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.runtime.cli import benchmark_command

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
    # one GPU: the PyTorch reference and JAX with the kit's defaults, SYNTHETIC; FULL with the
    # GPU-resident loaders and with DALI's file reader
    "gpu": [
        ("torch bf16 channels_last", "torch", "synthetic", SHORT, []),
        ("jax bf16", "jax", "synthetic", SHORT, []),
        ("jax device loader", "jax", "io full", SHORT, ["--data_loader_config", "device"]),
        ("jax dali-device", "jax", "io full", SHORT, ["--data_loader_config", "dali-device"]),
        (
            "jax dali-npy 16 threads",
            "jax",
            "io full",
            SHORT,
            ["--data_loader_config", "dali-npy", "--set", "dali_threads=16"],
        ),
    ],
}


def run_suite(entries: str | list[tuple], out: Path, extra: Sequence[str] = (), timeout: int = 600) -> list[dict]:
    """Run every entry of a suite (a name of :data:`SUITES`, or a list of entries of the same form, as
    studies define them); append results to ``out`` (JSON lines); return them."""
    if isinstance(entries, str):
        if entries not in SUITES:
            raise UserError(f"suite {entries!r}: expected one of {', '.join(SUITES)}")
        entries = SUITES[entries]
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for label, framework, modes, config, args, *env in entries:
        cmd = benchmark_command(
            framework, modes.split(), ["--config", config], label=label, out=out, extra=[*args, *extra]
        )
        environ = {**os.environ, **(env[0] if env else {})}
        print(f"[suite] {label}: {' '.join(cmd[1:])} {env[0] if env else ''}", flush=True)
        t0 = time.perf_counter()
        new, failure, output = run_process(cmd, out, timeout, environ)
        records += new
        print(f"[suite] {label}: {'ok' if not failure else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
        if failure:
            print(output[-1500:] or failure, flush=True)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.suite", __doc__.split("\n\n")[0])
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
