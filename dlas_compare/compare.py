"""The comparison command: TF, JAX and the PyTorch reference on one config, every mode, one table.

    python -m dlas_compare.compare --config cpu_default                       # TF and JAX rows on a CPU
    python -m dlas_compare.compare --config short_opt --data_loader_config dali-npy --out results/h200/cmp.jsonl

Each framework runs in its own process (``dlas_compare.benchmark``) over IO, SYNTHETIC and FULL. A
framework that is not installed (TF on the GPU machine) or cannot run here (the PyTorch reference
needs a GPU) gets a note instead of a row; one that fails gets a note and makes the exit code 1. An
unknown option or a missing training file (IO and FULL read it) is one ``error:`` line before any
process starts.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dlas_compare import benchmark
from dlas_compare.benchmark import MODES, run_process, table
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import run_cli
from shared_data.runtime import sizing
from shared_data.runtime.checks import check_data_files
from shared_data.runtime.cli import benchmark_command

MODULES = {"jax": "jax", "tf": "tensorflow", "torch": "torch"}


def availability(framework: str) -> str | None:
    """None if ``framework`` can run here, else why not."""
    if importlib.util.find_spec(MODULES[framework]) is None:
        return f"{MODULES[framework]} is not installed"
    if framework == "torch":
        ok = (
            subprocess.run(
                [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                capture_output=True,
            ).returncode
            == 0
        )
        if not ok:
            return "the PyTorch reference runs on a GPU only"
    return None


def benchmark_args(prog: str, modes: Sequence[str], config: str, extra: Sequence[str]):
    """The arguments each benchmark process gets (``extra``: the options compare does not take), parsed
    here first so that a typo is one line under compare's own name (``prog``) before anything starts."""
    parser = benchmark.build_parser()
    parser.prog = prog
    return parser.parse_args(["--framework", "jax", "--mode", *modes, "--config", config, *extra])


def warn_if_oversized(cfg, steps: int) -> None:
    """Say before the first benchmark process starts when ``cfg`` is sized for a GPU that this host
    lacks (:func:`shared_data.runtime.sizing.oversized_warning`, ``steps`` in all): each process's own
    warning reaches the user only when it ends."""
    warning = sizing.oversized_warning(cfg, steps, "the comparison")
    if warning:
        print(f"[compare] warning: {warning}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.compare", __doc__.split("\n\n")[0])
    p.add_argument("--config", default="cpu_default", help=config_cli.config_help())
    p.add_argument(
        "--frameworks",
        nargs="+",
        choices=list(MODULES),
        default=list(MODULES),
        help="frameworks to run, each in its own benchmark process (default: all; one that cannot run here "
        "gets a note instead of a row)",
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="benchmark modes (default: all)")
    p.add_argument("--out", default="results/compare.jsonl", help="JSON lines file the records are appended to")
    p.add_argument("--timeout", type=int, default=900, help="seconds per framework")
    p.epilog = "Other options (--data_loader_config, --set KEY=VALUE, ...) go to each benchmark process."
    args, extra = p.parse_known_args(argv)
    bench_args = benchmark_args(p.prog, args.modes, args.config, extra)
    cfg = config_cli.config_from_args(bench_args)
    steps = bench_args.warmup + bench_args.windows * bench_args.steps
    warn_if_oversized(cfg, len(args.frameworks) * len(args.modes) * steps)
    if {"io", "full"} & set(args.modes):  # each process would stop on it: one line before any starts
        check_data_files(cfg, ("train",))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records, notes, failed = [], [], False
    for fw in args.frameworks:
        why = availability(fw)
        if why:
            notes.append(f"{fw}: skipped ({why})")
            continue
        cmd = benchmark_command(
            fw, args.modes, ["--config", args.config], label=f"{fw} {args.config}", out=out, extra=extra
        )
        print(f"[compare] {' '.join(cmd[1:])}", flush=True)
        new, failure, _ = run_process(cmd, out, args.timeout, echo=f"[compare {fw}] ")
        if failure:
            notes.append(f"{fw}: failed ({failure})")
            failed = True
        records += new
    print(table(records))
    for note in notes:
        print(note)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
