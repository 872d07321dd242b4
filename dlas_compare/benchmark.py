"""The benchmark command: IO / SYNTHETIC / FULL for one framework and loader (the tutorial's "benchy").

    python -m dlas_compare.benchmark --framework jax --mode synthetic --config short_opt
    python -m dlas_compare.benchmark --framework torch --mode full --config short_opt --data_loader_config dali-npy

Warm-up steps first (compilation, autotuning, pipeline start), in IO and FULL a drain of what the
input read ahead (steps until one waits on the loader, :func:`~dlas_compare.benchmark_timing.drain`),
then ``--windows`` timed windows of ``--steps`` steps, each ended by a device sync; with ``--window_sec
S`` windows hold at most as many steps as one synced step says fit in S seconds and end once a step
returns S seconds or more into them, so slow input pipelines and fast steps take about the same time,
but never fewer than ``--min_window_steps`` steps (a window of one slow step measures when one batch
happened to arrive, not the pipeline's rate). The modes of one command run in one process, SYNTHETIC
first: FULL takes over SYNTHETIC's compiled step and IO's input pipeline
(:class:`~dlas_compare.benchmark_session.Session`); ``--rungs`` runs a list of such benchmarks (the
ladder's rungs of one framework) in one process.
Reports samples/s (median over windows), step time (p50 / p90 over windows), MFU (analytic model
FLOPs x samples/s over the datasheet's dense peak of the compute dtype, and the fraction of the measured
matmul rate beside it: :mod:`dlas_compare.peaks`), compile seconds, peak device memory, device, versions
and the command line, as JSON (``--out``) and a table printed last.

This module is the command line, the table and the records file; the timing and the record are
:mod:`dlas_compare.benchmark_timing`, the modes' order and what they share
:mod:`dlas_compare.benchmark_session`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dlas_compare.benchmark_session import FRAMEWORKS, Session, replica_check
from dlas_compare.benchmark_timing import stage
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import check_not_input
from shared_data.runtime import sizing
from shared_data.runtime.checks import check_data_files

MODES = ("io", "synthetic", "full")


def table(records: list[dict]) -> str:
    """One line per record: label, mode, loader, precision, batch, samples/s, step ms, MFU (of the
    datasheet peak), the fraction of the measured matmul rate, compile, memory. The compile column
    says ``-`` for IO (no step) and ``reused`` for a step compiled by an earlier mode of the session
    (its seconds are in that mode's line)."""
    head = (
        f"{'run':<34}{'mode':<10}{'loader':<14}{'prec':<9}{'batch':>6}{'samples/s':>11}{'step ms p50/p90':>17}"
        f"{'MFU':>7}{'of matmul':>10}{'compile s':>10}{'mem GiB':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        of_matmul = f"{100 * r['mfu_of_measured_matmul']:.1f}%" if r.get("mfu_of_measured_matmul") else "-"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
        loader = r["loader"] if r["mode"] != "synthetic" else "-"
        compiled = (
            "-" if r["mode"] == "io" else "reused" if "train step" in r.get("reused", ()) else f"{r['compile_sec']:.1f}"
        )
        lines.append(
            f"{r['label'][:33]:<34}{r['mode']:<10}{loader[:13]:<14}{r['precision'][:8]:<9}{r['global_batch']:>6}"
            f"{r['samples_per_sec']:>11.1f}{r['step_ms_p50']:>9.1f}/{r['step_ms_p90']:<7.1f}{mfu:>7}"
            f"{of_matmul:>10}{compiled:>10}{mem:>9}"
        )
    return "\n".join(lines)


def append_records(path: str | Path, records: list[dict]) -> None:
    """Append ``records`` to the JSON-lines file ``path`` (one record per line; folders made), all or
    none: an append that fails (a full disk) cuts the file back to its earlier end, or removes it
    where this call made it, so no partial line is left for a reader or a ``--resume``.

    Raises:
        OSError: the append failed (the file is as before).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if path.exists() else None
    try:
        with open(path, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    except OSError:
        if path.is_file():  # a device such as /dev/full has no end to cut back to
            try:
                path.unlink() if size is None else os.truncate(path, size)
            except OSError:
                pass  # the append's own error (say, no space left) is the one to report
        raise


def run_process(
    cmd: Sequence[str], out: Path, timeout: float, env: dict | None = None, echo: str | None = None, progress=None
) -> tuple[list[dict], str | None, str]:
    """Run a benchmark command line ``cmd`` that appends its records to ``out`` in a subprocess;
    return the records it appended, why it failed (``exit N: <last line>``, ``timed out after T s``;
    None when it did not) and its output (stderr, else stdout). With ``echo`` (a prefix), each line
    the process writes on stderr (its stages and progress) is also printed on this one's stderr as it
    comes, so a long benchmark is not minutes of silence. ``progress`` (optional) is called with the
    records appended so far each time the process appends one or more whole lines, while it runs, so
    a caller can keep each one as it comes."""
    import subprocess
    import threading

    before = out.read_text().count("\n") if out.exists() else 0

    def appended() -> list[dict]:
        text = out.read_text() if out.exists() else ""
        whole = text[: text.rfind("\n") + 1]  # a line still being written is not read
        return [json.loads(line) for line in whole.splitlines()[before:] if line]

    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said: dict[str, list[str]] = {"stdout": [], "stderr": []}

    def read(name: str) -> None:
        for line in getattr(proc, name):
            said[name].append(line)
            if echo is not None and name == "stderr":
                print(f"{echo}{line}", end="", file=sys.stderr, flush=True)

    readers = [threading.Thread(target=read, args=(name,), daemon=True) for name in said]
    for reader in readers:
        reader.start()
    deadline, failure, seen = time.monotonic() + timeout, None, 0
    while True:
        try:
            code = proc.wait(timeout=0.5 if progress else max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            code = None
        if progress is not None and len(got := appended()) > seen:
            seen = len(got)
            progress(got)
        if code is not None:
            break
        if time.monotonic() >= deadline:
            proc.kill()
            proc.wait()
            failure = f"timed out after {timeout:.0f} s"
            break
    for reader in readers:
        reader.join(timeout=10)
    output = ("".join(said["stderr"]).strip() or "".join(said["stdout"]).strip()) or ("" if failure else "no output")
    if failure is None and code:
        failure = f"exit {code}: {output.splitlines()[-1]}"
    return appended(), failure, output


def int_at_least(minimum: int):
    """An argparse ``type`` accepting integers >= ``minimum`` (counts of steps, windows, ...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type`` accepting numbers > 0 (durations in seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("dlas_compare.benchmark", __doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument(
        "--framework", choices=FRAMEWORKS, default="jax", help="implementation to run (default: %(default)s)"
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        nargs="+",
        default=["synthetic"],
        help="io: the input pipeline alone; synthetic: train steps on one cached batch; full: both "
        "(default: %(default)s)",
    )
    p.add_argument("--warmup", type=int_at_least(0), default=5, help="untimed steps first")
    p.add_argument("--steps", type=int_at_least(1), default=10, help="steps per timed window")
    p.add_argument("--windows", type=int_at_least(1), default=5, help="timed windows")
    p.add_argument(
        "--window_sec",
        type=positive_float,
        help="end a window early once it has lasted this many seconds (--steps is then the most per window)",
    )
    p.add_argument(
        "--min_window_steps",
        type=int_at_least(1),
        default=1,
        help="with --window_sec, the fewest steps a window holds however long they take (default: %(default)s)",
    )
    p.add_argument("--num_devices", type=int, help="data parallel over the first N devices (default: all)")
    p.add_argument("--label", help="name of this run in the table")
    p.add_argument(
        "--replica_check",
        type=int_at_least(1),
        metavar="STEPS",
        help="with --num_devices N > 1: then train STEPS steps from the initial weights on 1 device and on N "
        "at the same global batch, and record both losses per step and whether they agree (replica_check)",
    )
    p.add_argument(
        "--rungs",
        metavar="JSON",
        help="run several benchmarks in this process, in order (see run_rungs); needs --out",
    )
    p.add_argument("--out", help="append the JSON records to this file (JSON lines)")
    return p


def run_rungs(argv: list[str], path: str, out: str) -> list[dict]:
    """``--rungs``: the benchmarks of the JSON file ``path``, a list of ``{"args": [...], "record":
    {...}}``, one after another in one :class:`Session` (one per ``--num_devices``), each with the
    command line ``argv`` (less ``--rungs``) plus its ``args``; each one's records, with its
    ``record`` keys and ``rung_sec`` (seconds it took in this process), are appended to ``out`` as it
    ends, so a later one that fails loses none of them. Returns all records.

    Raises:
        UserError: ``path`` is not such a list.
    """
    expected = f'--rungs {path}: expected a JSON list of {{"args": [...], "record": {{...}}}}'
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{expected} ({err})") from None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("args"), list) for e in entries
    ):
        raise UserError(expected)
    i = argv.index("--rungs")
    base = argv[:i] + argv[i + 2 :]
    sessions, everything = {}, []
    for entry in entries:
        t0 = time.perf_counter()
        args = build_parser().parse_args([*base, *entry["args"]])
        cfg = config_cli.config_from_args(args)
        session = sessions.setdefault(args.num_devices, Session(args.framework, args.num_devices))
        records = session.run(
            cfg, args.mode, args.warmup, args.steps, args.windows, args.label, args.window_sec, args.min_window_steps
        )
        if args.replica_check:
            records[-1]["replica_check"] = replica_check(args.framework, cfg, args.num_devices, args.replica_check)
        for r in records:
            r.update(entry.get("record", {}), rung_sec=time.perf_counter() - t0)
        append_records(out, records)
        stage(f"[benchmark] {args.label or args.framework}: done in {time.perf_counter() - t0:.0f} s")
        everything += records
    return everything


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.replica_check and (args.num_devices or 1) < 2:
        raise UserError("--replica_check needs --num_devices N with N >= 2 (it compares N replicas with one device)")
    if args.rungs:
        if not args.out:
            raise UserError("--rungs needs --out (its records are appended there as each benchmark ends)")
        print(table(run_rungs(argv, args.rungs, args.out)))
        return 0
    cfg = config_cli.config_from_args(args)
    if args.framework == "torch":  # what the reference cannot run, before the hours a GPU config takes here
        from dlas_compare import torch_ref

        for mode in args.mode:
            torch_ref.check_input(cfg, mode)
        torch_ref.require_torch()
    warning = sizing.oversized_warning(cfg, len(args.mode) * (args.warmup + args.windows * args.steps), "the benchmark")
    if warning:
        stage(f"warning: {warning}")
    check_not_input({"--out": args.out}, cfg.data_inputs(), "records")
    if {"io", "full"} & set(args.mode):  # before a step compiles: IO and FULL read the training file
        check_data_files(cfg, ("train",))
    session = Session(args.framework, args.num_devices)
    records = session.run(
        cfg, args.mode, args.warmup, args.steps, args.windows, args.label, args.window_sec, args.min_window_steps
    )
    if args.replica_check:
        records[-1]["replica_check"] = replica_check(args.framework, cfg, args.num_devices, args.replica_check)
    if args.out:
        append_records(args.out, records)
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
