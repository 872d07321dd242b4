"""The ladder command: the tutorial's lessons one rung at a time, IO / SYNTHETIC / FULL at each rung.

    python -m dlas_compare.ladder --frameworks jax tf --config cpu_default --out runs/ladder/cpu_default.jsonl
    dlas-ladder --frameworks jax tf torch --config short_opt --steps 40 --window_sec 1 --budget_sec 530
    python -m dlas_compare.ladder --replot runs/ladder/cpu_default.jsonl --figure ladder.png    # table + figure again

The tutorial's README takes one training from a baseline up one lesson at a time and prints IO,
SYNTHETIC and FULL at each step. Here each rung is a benchmark of the same config
(:mod:`dlas_compare.benchmark`) with the settings of the rung before plus one change. A framework's
rungs run in as few benchmark processes as its settings allow
(:meth:`dlas_compare.ladder_schedule.Schedule.groups`), so its import, GPU set-up and train step
(compiled, autotuned) carry over from rung to rung: one for TF and one for PyTorch, two for JAX,
which reads ``XLA_FLAGS`` once per process and adds the kit's flags at compilation
(:func:`dlas_compare.ladder_rungs.process_xla_flags`). Frameworks never share a process. A rung
that crashes its process loses only itself: the rungs after it run in a new process.

    #  rung                change                                      lesson
    1  baseline            lowmem loader, 4 workers, fp32, TF without  the tutorial's starting point
                           XLA, the kit's XLA flags off
    2  more workers        8 workers (--more_workers)                  more workers hide the read latency
    3  DALI                dali-npy                                    DALI moves decode/augment off the workers
    4  mixed precision     AMP (amp_dtype: bfloat16 by default)        AMP halves the math
    5  compilation         TF: XLA (enable_jit); JAX, which compiles   compilation fuses
                           every rung: the kit's XLA flags
    6  GPU-resident input  device loader                               the host leaves the input path
    7  data parallel       all GPUs (--num_devices), local batch =     data parallel multiplies
                           the config's global batch

A rung that cannot run here (no GPU, no DALI or no ``.npy`` twins, one device, a lesson the PyTorch
reference has no switch for) is listed as skipped with the reason, and the next rung builds on the
last one that ran. The PyTorch reference (``torch``) runs on a GPU only.

Each rung reports IO, SYNTHETIC and FULL samples/s, the FULL speedup over the baseline and over the
previous rung, and a verdict: **input-bound** when FULL < 0.8 x SYNTHETIC and IO < SYNTHETIC (the
pipeline alone cannot feed the step), **compute-bound** otherwise, and **unreliable**, no conclusion,
when FULL > 1.1 x IO or FULL > 1.1 x SYNTHETIC (training on the input can outrun neither the input
alone nor the step alone: the windows measured noise). A rung measures FULL and the modes
its change can move (a new input: IO; a new train step: SYNTHETIC); the other mode is the previous
rung's, shown in parentheses (``--all_modes`` measures all three at every rung).

The ladder says up front what it will run: its processes, every rung's modes and estimated seconds,
the estimated total, the skipped rungs with their reasons. Timed windows hold at least
``--min_window_steps`` steps (a slow rung's window of one step measures when a batch happened to
arrive). With ``--budget_sec`` the windows are trimmed (never the rungs, never below that floor; the
fast rungs' first) so the estimate fits, and fitted again before each process as the real times come
in (:mod:`dlas_compare.ladder_budget`); if even the floor does not fit, the schedule names the rungs
the budget is expected to stop.

Output: the table on stdout; JSON lines appended to ``--out``, per rung that ran its benchmark
records (the schema of :func:`dlas_compare.benchmark_timing.run_bench`, plus ``ladder_id``, ``ladder_step``,
``ladder_rung``, ``ladder_settings``, ``ladder_xla_flags``), and for every rung, skipped ones too, one
summary record (``"record": "ladder_summary"``, no ``mode`` key), each rung's as soon as it
finishes; and a figure (``--figure``, :mod:`dlas_compare.ladder_figure`): FULL per rung, one bar per
framework, min-max whiskers over the timed windows; in samples/s beside the tutorial's A100 ladder
where the batch and crop are the tutorial's (64, 64^3), else relative to each framework's own
baseline, without the A100.

This module is the command (its options and ``main``); the parts live beside it:
:mod:`dlas_compare.ladder_rungs` (the rungs, the device probe, the plan),
:mod:`dlas_compare.ladder_schedule` (processes, modes, ``--resume`` reuse, what is said up front),
:mod:`dlas_compare.ladder_budget` (the time estimates and windows that fit ``--budget_sec``),
:mod:`dlas_compare.ladder_runner` (the benchmark processes, the records written as each rung ends,
reading a ladder's file back), :mod:`dlas_compare.ladder_verdicts` (bottleneck, speedups, summaries),
:mod:`dlas_compare.ladder_table` and :mod:`dlas_compare.ladder_figure` (the outputs).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlas_compare import ladder_budget as budget_mod
from dlas_compare.benchmark import MODES, int_at_least, positive_float
from dlas_compare.benchmark_session import FRAMEWORKS
from dlas_compare.ladder_figure import write_figure
from dlas_compare.ladder_rungs import BASELINE_WORKERS, LADDER_KEYS, MORE_WORKERS, plan, probe
from dlas_compare.ladder_runner import read_resume, read_summaries, run_ladder
from dlas_compare.ladder_schedule import make_schedule, schedule_lines
from dlas_compare.ladder_table import noise_lines, table
from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import DatasetError, UserError, run_cli
from shared_data.core.files import check_writable
from shared_data.runtime import sizing
from shared_data.runtime.checks import generate_command


def forwarded_config_args(args: argparse.Namespace) -> list[str]:
    """The config options of the ladder's command line for every rung's benchmark, as ``--set``
    (so they never conflict with the rungs' flags).

    Raises:
        UserError: a setting the rungs own (:data:`LADDER_KEYS`) was given.
    """
    sets = [config_cli.parse_override(s) for s in args.set]
    given = [k for k in LADDER_KEYS if getattr(args, k, None) is not None] + [k for k, _ in sets if k in LADDER_KEYS]
    if given:
        raise UserError(f"{given[0]} is set by the ladder's rungs; leave it out (they own {', '.join(LADDER_KEYS)})")
    return config_cli.config_argv(args)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("dlas_compare.ladder", __doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument(
        "--frameworks",
        nargs="+",
        choices=FRAMEWORKS,
        default=list(FRAMEWORKS),
        help="ladders to climb, one per framework (default: all; one that cannot run here is listed as skipped)",
    )
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="FULL is required (the speedups)")
    p.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed steps per mode")
    p.add_argument(
        "--steps", type=int_at_least(1), default=10, help="steps per timed window (at most, with --window_sec)"
    )
    p.add_argument("--windows", type=int_at_least(1), default=3, help="timed windows per mode (at most, with a budget)")
    p.add_argument(
        "--window_sec",
        type=positive_float,
        default=2.0,
        help="timed windows of about this many seconds (at most, with a budget; default: %(default)s)",
    )
    p.add_argument(
        "--min_window_steps",
        type=int_at_least(1),
        default=budget_mod.MIN_STEPS,
        help="the fewest steps a timed window holds however slow (the budget never trims below; default: %(default)s)",
    )
    p.add_argument(
        "--all_modes",
        action="store_true",
        help="measure every mode at every rung (default: the modes a rung's change can move)",
    )
    p.add_argument(
        "--more_workers",
        type=int_at_least(BASELINE_WORKERS + 1),
        default=MORE_WORKERS,
        help="workers of the 'more workers' rung (default: %(default)s; the baseline has 4)",
    )
    p.add_argument(
        "--num_devices",
        type=int_at_least(2),
        help="devices of the data-parallel rung (default: all GPUs; a number runs it on CPU devices too)",
    )
    p.add_argument("--out", help="JSON lines file appended to (default: runs/ladder/<config>.jsonl)")
    p.add_argument("--figure", help="PNG of the relative speedups (default: --out with .png)")
    p.add_argument("--timeout", type=positive_float, default=600, help="seconds per rung and framework")
    p.add_argument(
        "--budget_sec",
        type=positive_float,
        help="seconds for the whole ladder (probes included): windows are trimmed to fit it; past it, later "
        "rungs are skipped and a running one is stopped",
    )
    p.add_argument("--replot", metavar="JSONL", help="print the table and draw the figure of the last ladder in JSONL")
    p.add_argument(
        "--resume",
        metavar="JSONL",
        help="take the rungs that ran in the last ladder in JSONL with the same settings from it, run the rest "
        "(refused for a ladder of another config or other config values)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    start = time.perf_counter()
    args = build_parser().parse_args(argv)
    if args.replot:
        summaries = read_summaries(Path(args.replot))
        print(table(summaries))
        print("\n".join([s["line"] for s in summaries] + noise_lines(summaries)))
        figure = Path(args.figure or Path(args.replot).with_suffix(".png"))
        write_figure(summaries, figure, summaries[0]["config"])
        print(f"wrote {figure}")
        return 0
    if "full" not in args.modes:
        raise UserError("--modes must include full: the ladder's speedups are FULL samples/s")
    common = forwarded_config_args(args)
    common += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    cfg = config_cli.config_from_args(args)
    out = Path(args.out or f"runs/ladder/{cfg.name}.jsonl")
    figure = Path(args.figure or out.with_suffix(".png"))
    check_writable(out, "--out")  # before anything is measured: a ladder takes minutes
    check_writable(figure, "--figure")
    resume = read_resume(Path(args.resume), cfg) if args.resume else []
    # before the data check: a newcomer learns the config is GPU-sized before generating its volume
    first_rungs = len(args.frameworks) * (args.warmup + args.windows * args.steps)
    warning = sizing.oversized_warning(cfg, first_rungs, "the first rung of each framework")
    if warning:
        print(f"[ladder] warning: {warning}", file=sys.stderr, flush=True)
    train = cfg.data_file("train")
    if not train.is_file():  # the command makes the .npy twins that the DALI rung reads too
        command = generate_command(config_mod.replace(cfg, data_loader_config="dali-npy"), "train")
        raise DatasetError(f"config {cfg.name!r} reads {train}, which does not exist ({command})")
    steps = {}
    with ThreadPoolExecutor(len(args.frameworks)) as pool:  # the probes are processes: all at once
        found_all = list(pool.map(probe, args.frameworks))
    for fw, found in zip(args.frameworks, found_all):
        steps[fw] = plan(fw, found, cfg, args.more_workers, args.num_devices)
        print(f"[ladder] {fw}: {found.reason or f'{found.devices} device(s), {found.device}'}", flush=True)
    want = budget_mod.Windows(args.windows, args.window_sec, args.min_window_steps)
    schedule = make_schedule(steps, args.modes, want, args.budget_sec, args.all_modes, resume)
    left = None if args.budget_sec is None else args.budget_sec - (time.perf_counter() - start)
    print("\n".join(f"[ladder] {line}" for line in schedule_lines(schedule, left)), flush=True)
    summaries = run_ladder(schedule, common, out, args.timeout, cfg.name, start)
    print(table(summaries))
    print("\n".join([s["line"] for s in summaries if s["status"] == "ran"] + noise_lines(summaries)))
    try:
        write_figure(summaries, figure, cfg.name)
    except OSError as err:
        raise UserError(
            f"--figure {figure}: cannot write the ladder's figure ({err.strerror or err}); the measurements "
            f"are in {out}: --replot {out} --figure PATH draws it"
        ) from None
    print(f"wrote {out} and {figure}")
    return 1 if any(s["status"] == "failed" for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
