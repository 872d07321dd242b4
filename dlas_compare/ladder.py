"""The ladder command: the tutorial's lessons one rung at a time, IO / SYNTHETIC / FULL at each rung.

    python -m dlas_compare.ladder --frameworks jax tf --config cpu_default --out runs/ladder/cpu_default.jsonl
    dlas-ladder --frameworks jax tf torch --config short_opt --steps 40 --window_sec 1 --budget_sec 530
    python -m dlas_compare.ladder --replot runs/ladder/cpu_default.jsonl --figure ladder.png    # table + figure again

The tutorial's README takes one training from a baseline up one lesson at a time and prints IO,
SYNTHETIC and FULL at each step. Here each rung is a benchmark of the same config
(:mod:`dlas_compare.benchmark`) with the settings of the rung before plus one change. A framework's
rungs run in as few benchmark processes as its settings allow (:meth:`Schedule.groups`), so its
import, GPU set-up and train step (compiled, autotuned) carry over from rung to rung: one for TF and
one for PyTorch, two for JAX, which reads ``XLA_FLAGS`` once per process and adds the kit's flags at
compilation (:func:`process_xla_flags`). Frameworks never share a process. A rung that crashes its
process loses only itself: the rungs after it run in a new process.

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
when FULL > 1.1 x IO (training on the input cannot outrun the input alone: the windows measured
noise). A rung measures FULL and the modes
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
records (the schema of :func:`dlas_compare.benchmark.run_bench`, plus ``ladder_id``, ``ladder_step``,
``ladder_rung``, ``ladder_settings``, ``ladder_xla_flags``), and for every rung, skipped ones too, one
summary record (``"record": "ladder_summary"``, no ``mode`` key); and a figure (``--figure``,
:mod:`dlas_compare.ladder_figure`): FULL samples/s per rung, one bar per framework, min-max whiskers
over the timed windows, the tutorial's A100 ladder beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlas_compare import ladder_budget as budget_mod
from dlas_compare import ladder_figure as ladder_figure_mod
from dlas_compare.benchmark import FRAMEWORKS, MODES, append_records, int_at_least, positive_float, run_process
from shared_data.core import config as config_mod
from shared_data.core.commands import command_name, make_parser
from shared_data.core.config import Config
from shared_data.core.errors import DatasetError, UserError, run_cli
from shared_data.runtime.cli import benchmark_command
from shared_data.runtime.xla_flags import DEFAULT_XLA_FLAGS, default_xla_flags_off

BASELINE_WORKERS = 4  # the tutorial's baseline worker count
MORE_WORKERS = 8
INPUT_BOUND = 0.8  # FULL below this fraction of SYNTHETIC (and IO below SYNTHETIC): input-bound
UNRELIABLE = 1.1  # FULL above this multiple of IO: the windows measured noise
SAME = 0.05  # a FULL ratio within 1 +- SAME over the previous rung counts as no change
#: the settings the rungs own; a user's value for them would break the ladder's steps
LADDER_KEYS = ("data_loader_config", "num_data_workers", "enable_amp", "enable_jit", "local_batch_size")
DALI_PLUGINS = {"jax": "nvidia.dali.plugin.jax", "tf": "nvidia.dali.plugin.tf", "torch": "nvidia.dali.plugin.pytorch"}
MODULES = {"jax": "jax", "tf": "tensorflow", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class Rung:
    """One lesson: ``name`` (records), ``title`` (table and figure), ``lesson`` (its one line)."""

    name: str
    title: str
    lesson: str


RUNGS = (
    Rung("baseline", "baseline", "the tutorial's starting point"),
    Rung("workers", "more workers", "more workers hide the read latency"),
    Rung("dali", "DALI", "DALI moves decode and augmentation off the Python workers"),
    Rung("amp", "mixed precision", "AMP halves the math (half-precision tensor cores, half the bytes)"),
    Rung("compile", "compilation", "compilation fuses kernels and picks layouts"),
    Rung("device", "GPU-resident input", "GPU-resident input takes the host out of the input path"),
    Rung("data_parallel", "data parallel", "data parallel multiplies the samples per step"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a rung's benchmark runs with: config keys, whether the kit's XLA flags are on
    (:data:`shared_data.runtime.xla_flags.DEFAULT_XLA_FLAGS`), devices and the per-device batch (samples;
    None: the config's global batch on one device)."""

    data_loader_config: str = "lowmem"
    num_data_workers: int = BASELINE_WORKERS
    enable_amp: bool = False
    enable_jit: bool = False
    kit_xla_flags: bool = False
    num_devices: int = 1
    local_batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class Probe:
    """What one framework finds on this machine (:func:`probe`).

    Attributes:
        framework: ``jax``, ``tf`` or ``torch``.
        reason: why the framework cannot run here at all; None when it can.
        gpus: GPUs it sees.
        devices: devices it sees (GPUs, else its CPU devices).
        device: the first device's name.
        dali: why DALI's plugin for it does not import; None when it does.
    """

    framework: str
    reason: str | None = None
    gpus: int = 0
    devices: int = 0
    device: str = ""
    dali: str | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """Rung ``index`` (1-based) of ``framework``'s ladder: its cumulative settings (for a skipped
    rung, the ones it would have had), why it is skipped (None: it runs) and a note on what it
    shows on this machine."""

    framework: str
    index: int
    rung: Rung
    settings: Settings
    skip: str | None = None
    note: str = ""


_PROBE_CODE = {
    "jax": (
        "import jax\nds = jax.devices()\n"
        "info = dict(gpus=sum(d.platform == 'gpu' for d in ds), devices=len(ds),"
        " device=getattr(ds[0], 'device_kind', ds[0].platform))\n"
    ),
    "tf": (
        "import tensorflow as tf\ngpus = tf.config.list_physical_devices('GPU')\n"
        "info = dict(gpus=len(gpus), devices=len(gpus) or len(tf.config.list_logical_devices('CPU')),"
        " device='GPU' if gpus else 'CPU')\n"
    ),
    "torch": (
        "import torch\nn = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "info = dict(gpus=n, devices=n, device=torch.cuda.get_device_name(0) if n else 'cpu')\n"
    ),
}


def probe(framework: str, timeout: int = 180) -> Probe:
    """Ask ``framework`` in a fresh process (frameworks never share the ladder's process) which
    devices it sees and whether DALI's plugin for it imports.

    Raises:
        UserError: ``framework`` is not one of :data:`dlas_compare.benchmark.FRAMEWORKS`.
    """
    if framework not in _PROBE_CODE:
        raise UserError(f"framework {framework!r}: expected one of {', '.join(FRAMEWORKS)}")
    import importlib.util

    if importlib.util.find_spec(MODULES[framework]) is None:
        return Probe(framework, reason=f"{MODULES[framework]} is not installed")
    code = (
        "import importlib, json\n"
        + _PROBE_CODE[framework]
        + "try:\n"
        + f"    importlib.import_module({DALI_PLUGINS[framework]!r})\n"
        + "    info['dali'] = None\n"
        + "except Exception as err:\n"
        + "    info['dali'] = f'{type(err).__name__}: {err}'\n"
        + "print(json.dumps(info))\n"
    )
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Probe(framework, reason=f"its device probe timed out after {timeout} s")
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return Probe(framework, reason=f"its device probe failed ({tail})")
    info = json.loads(lines[-1])
    dali = info["dali"] and f"DALI's {framework} plugin does not import here ({info['dali']})"
    if framework == "torch" and not info["gpus"]:
        return Probe(framework, reason="the PyTorch reference runs on a GPU only, and torch sees none", dali=dali)
    return Probe(framework, None, info["gpus"], info["devices"], info["device"], dali)


def _change(
    rung: Rung,
    framework: str,
    found: Probe,
    cfg: Config,
    current: Settings,
    more_workers: int,
    num_devices: int | None,
    cpu_count: int,
) -> tuple[dict, str | None, str]:
    """The settings ``rung`` changes, why it cannot run (None: it can), and a note for its line."""
    gpu = found.gpus > 0
    torch = framework == "torch"
    if rung.name == "baseline":
        if torch:
            return {}, None, "the reference runs channels_last_3d, cudnn.benchmark, fused Adam and TF32 in every rung"
        return {}, None, ""
    if rung.name == "workers":
        note = f"{more_workers} worker threads on {cpu_count} cores" if cpu_count < more_workers else ""
        return {"num_data_workers": more_workers}, None, note
    if rung.name == "dali":
        change = {"data_loader_config": "dali-npy"}
        missing = [p for p in cfg.npy_files("train") if not p.is_file()]
        if found.dali:
            return change, found.dali, ""
        if missing:
            train = cfg.data_file("train")
            return change, f"no .npy twin {missing[0]} ({command_name('shared_data.data.convert')} {train})", ""
        where = "" if gpu else "CPU-only pipeline, "
        return change, None, f"{where}dali_threads={cfg.dali_threads}"
    if rung.name == "amp":
        note = "" if gpu else "on a CPU, which has no GPU tensor cores"
        return {"enable_amp": True}, None, note
    if rung.name == "compile":
        if torch:
            return (
                {},
                "the reference has no switch: channels_last_3d, cudnn.benchmark and fused Adam are on from "
                "the baseline, and the benchmark does not run torch.compile",
                "",
            )
        flags = " ".join(DEFAULT_XLA_FLAGS)
        on_cpu = "" if gpu else ", which act on GPU convolutions only"
        if framework == "jax":
            note = f"JAX compiles every rung; this rung adds the kit's XLA flags ({flags}){on_cpu}"
        else:
            note = f"XLA for the train step (jit_compile) and the kit's XLA flags ({flags}){on_cpu}"
        return {"enable_jit": True, "kit_xla_flags": True}, None, note
    if rung.name == "device":
        change = {"data_loader_config": "device"}
        if torch:
            return change, "the reference has no GPU-resident loader (device is JAX's and TF's)", ""
        if not gpu:
            return change, "no GPU: the lesson is volumes in GPU memory (on a CPU device means host memory)", ""
        return change, None, "volumes in GPU memory, crops and symmetries by one compiled gather"
    # data parallel
    n = num_devices or found.gpus
    change = {"num_devices": n, "local_batch_size": cfg.global_batch_size}
    if torch:
        return change, "the reference's data parallel is dlas_compare.torch_ddp (torchrun, SYNTHETIC only)", ""
    if num_devices is None and found.gpus < 2:
        why = "no GPU" if not gpu else "1 GPU"
        return change, f"{why}: data parallel needs several GPUs (--num_devices N runs it on N of any devices)", ""
    if n > found.devices:
        return change, f"--num_devices {n}: {framework} sees {found.devices} device(s)", ""
    return change, None, f"global batch {n} x {cfg.global_batch_size}"


def plan(
    framework: str,
    found: Probe,
    cfg: Config,
    more_workers: int = MORE_WORKERS,
    num_devices: int | None = None,
    cpu_count: int | None = None,
) -> list[Step]:
    """``framework``'s ladder on this machine: one :class:`Step` per rung of :data:`RUNGS`, each with
    the settings of the last rung that ran plus its own change, or the reason it is skipped.

    ``found`` is the framework's :func:`probe`; ``cpu_count`` defaults to ``os.cpu_count()``.
    """
    cpu_count = cpu_count or os.cpu_count() or 1
    steps, current = [], Settings()
    for index, rung in enumerate(RUNGS, 1):
        if found.reason:
            steps.append(Step(framework, index, rung, current, skip=found.reason))
            continue
        change, skip, note = _change(rung, framework, found, cfg, current, more_workers, num_devices, cpu_count)
        settings = dataclasses.replace(current, **change)
        if skip is None:
            current = settings
        steps.append(Step(framework, index, rung, settings, skip, note))
    return steps


def benchmark_args(settings: Settings) -> list[str]:
    """The :mod:`dlas_compare.benchmark` flags of ``settings``."""
    args = [
        "--data_loader_config",
        settings.data_loader_config,
        "--num_data_workers",
        str(settings.num_data_workers),
        "--enable_amp" if settings.enable_amp else "--no-enable_amp",
        "--enable_jit" if settings.enable_jit else "--no-enable_jit",
        "--num_devices",
        str(settings.num_devices),
    ]
    if settings.local_batch_size is not None:
        args += ["--local_batch_size", str(settings.local_batch_size)]
    return args


def xla_flags(settings: Settings, environ: dict | None = None) -> str:
    """The ``XLA_FLAGS`` a rung's process starts with: the caller's, with the kit's defaults named
    off before the compilation rung (the frameworks add the defaults at import unless named)."""
    flags = (os.environ if environ is None else environ).get("XLA_FLAGS", "")
    return flags if settings.kit_xla_flags else default_xla_flags_off(flags)


def verdict(io: float | None, synthetic: float | None, full: float | None) -> tuple[str | None, str]:
    """The bottleneck of a rung from its samples/s, and why in words.

    ``unreliable`` when FULL > :data:`UNRELIABLE` x IO: training on the input cannot outrun the input
    alone, so the windows measured noise (too few steps, or batches read ahead), and no bottleneck is
    drawn from them. Else ``input-bound`` when FULL < :data:`INPUT_BOUND` x SYNTHETIC and IO <
    SYNTHETIC (or IO was not measured); ``compute-bound`` otherwise; None without SYNTHETIC or FULL.
    """
    if synthetic is None or full is None:
        return None, "no verdict without SYNTHETIC and FULL"
    if io is not None and full > UNRELIABLE * io:
        return "unreliable", (
            f"FULL {full:.1f} > {UNRELIABLE} x IO {io:.1f}: training on the input cannot outrun the input "
            "alone, so these windows measured noise; no conclusion"
        )
    low = full < INPUT_BOUND * synthetic
    if low and (io is None or io < synthetic):
        io_text = "IO not measured" if io is None else f"IO {io:.1f} < SYNTHETIC"
        return "input-bound", f"FULL {full:.1f} < {INPUT_BOUND} x SYNTHETIC {synthetic:.1f} and {io_text}"
    if low:
        return "compute-bound", (
            f"IO {io:.1f} >= SYNTHETIC {synthetic:.1f}, yet FULL {full:.1f} < {INPUT_BOUND} x SYNTHETIC: "
            "input and step contend for the host"
        )
    return "compute-bound", f"FULL {full:.1f} >= {INPUT_BOUND} x SYNTHETIC {synthetic:.1f}"


def effect(ratio: float) -> str:
    """Words for a FULL ratio over the previous rung (:data:`SAME` is the band of no change)."""
    if ratio > 1 + SAME:
        return "faster"
    if ratio < 1 - SAME:
        return "this rung slowed FULL down here"
    return f"no change beyond {100 * SAME:.0f}%"


def summarize(step: Step, records: list[dict], status: str, reason: str | None, ran: list[dict]) -> dict:
    """The summary record of one rung from its benchmark ``records``; ``ran`` holds the summaries of
    the rungs of the same framework that ran before it (the first is the baseline when it ran). A mode
    the rung did not measure (its change cannot move it, :data:`dlas_compare.ladder_budget.CHANGED_MODES`)
    takes the previous rung's value; ``values_from`` names the rung each value was measured at."""
    by_mode = {r["mode"]: r for r in records}
    base = ran[0] if ran and ran[0]["ladder_rung"] == "baseline" else None
    prev = ran[-1] if ran else None
    values, values_from = {}, {}
    for mode in MODES:
        if mode in by_mode:
            values[mode], values_from[mode] = by_mode[mode]["samples_per_sec"], step.index
        elif status == "ran" and prev and prev[f"{mode}_samples_per_sec"] is not None:
            values[mode], values_from[mode] = prev[f"{mode}_samples_per_sec"], prev["values_from"][mode]
        else:
            values[mode] = None
    io, synthetic, full = values["io"], values["synthetic"], values["full"]
    ratio = lambda other: full / other["full_samples_per_sec"] if (full and other) else None
    is_base = step.rung.name == "baseline" and full is not None
    bound, why = verdict(io, synthetic, full) if status == "ran" else (None, "")
    summary = {
        "record": "ladder_summary",
        "framework": step.framework,
        "ladder_step": step.index,
        "ladder_rung": step.rung.name,
        "rung_title": step.rung.title,
        "status": status,
        "reason": reason,
        "ladder_settings": dataclasses.asdict(step.settings),
        "measured_modes": [m for m in MODES if m in by_mode],
        "values_from": values_from,
        "io_samples_per_sec": io,
        "synthetic_samples_per_sec": synthetic,
        "full_samples_per_sec": full,
        "full_samples_per_sec_min": by_mode["full"]["samples_per_sec_min"] if "full" in by_mode else None,
        "full_samples_per_sec_max": by_mode["full"]["samples_per_sec_max"] if "full" in by_mode else None,
        "speedup_vs_baseline": 1.0 if is_base else ratio(base),
        "speedup_vs_previous": ratio(prev),
        "previous_rung": prev["ladder_rung"] if prev else None,
        "verdict": bound,
        "verdict_reason": why,
        "note": step.note,
        "device": next((r["device"] for r in records), None),
        "global_batch": next((r["global_batch"] for r in records), None),
    }
    summary["line"] = lesson_line(summary, step, prev)
    return summary


def lesson_line(summary: dict, step: Step, prev: dict | None) -> str:
    """One line: the rung's lesson, what FULL did, the bottleneck and where it moved."""
    head = f"{step.framework} {step.index}. {step.rung.title}: {step.rung.lesson}"
    if summary["status"] != "ran":
        return f"{head}; {summary['status']}: {summary['reason']}"
    parts = [head]
    full = summary["full_samples_per_sec"]
    if step.rung.name == "baseline":
        s = step.settings
        xla = {"tf": ", no XLA", "jax": ", the kit's XLA flags off"}.get(step.framework, "")
        parts.append(f"{s.data_loader_config}, {s.num_data_workers} workers, fp32{xla}: FULL {full:.1f} samples/s")
    elif summary["speedup_vs_previous"] is not None:
        base = summary["speedup_vs_baseline"]
        parts.append(
            f"FULL {full:.1f} samples/s, x{summary['speedup_vs_previous']:.2f} over {prev['rung_title']} "
            f"({effect(summary['speedup_vs_previous'])})"
            + (f", x{base:.2f} over the baseline" if base and prev["ladder_rung"] != "baseline" else "")
        )
    if summary["verdict"]:
        moved = ""
        if prev and prev["verdict"] and step.rung.name != "baseline":
            before, after = prev["verdict"], summary["verdict"]
            moved = f" (was {before}: the bottleneck moved)" if before != after else " (as before)"
        parts.append(f"{summary['verdict']}{moved}: {summary['verdict_reason']}")
    if step.note:
        parts.append(step.note)
    return "; ".join(parts)


def table(summaries: list[dict]) -> str:
    """Framework, rung, IO / SYNTHETIC / FULL samples/s (in parentheses: taken from an earlier rung,
    which measured it), FULL x baseline, x previous, verdict, a framework's rungs together in order; a
    framework skipped at every rung for one reason gets one row."""
    first = {fw: i for i, fw in enumerate(dict.fromkeys(s["framework"] for s in summaries))}
    summaries = sorted(summaries, key=lambda s: (first[s["framework"]], s["ladder_step"]))
    head = f"{'framework':<10}{'rung':<22}{'IO':>10}{'SYNTHETIC':>11}{'FULL':>10}{'x base':>8}{'x prev':>8}  verdict"
    lines = [head, "-" * len(head)]
    num = lambda v, fmt="{:.1f}": fmt.format(v) if v is not None else "-"
    shown = set()
    for s in summaries:
        fw = s["framework"]
        same = [t for t in summaries if t["framework"] == fw]
        if all(t["status"] == "skipped" and t["reason"] == s["reason"] for t in same) and len(same) == len(RUNGS):
            if fw not in shown:
                lines.append(f"{fw:<10}{'(every rung)':<22}skipped: {s['reason']}")
                shown.add(fw)
            continue
        rung = f"{s['ladder_step']} {s['rung_title']}"
        if s["status"] != "ran":
            lines.append(f"{fw:<10}{rung:<22}{s['status']}: {s['reason']}")
            continue
        rate = lambda mode: (
            num(s[f"{mode}_samples_per_sec"])
            if s.get("values_from", {}).get(mode, s["ladder_step"]) == s["ladder_step"]
            else f"({num(s[f'{mode}_samples_per_sec'])})"
        )
        lines.append(
            f"{fw:<10}{rung:<22}{rate('io'):>10}{rate('synthetic'):>11}"
            f"{rate('full'):>10}{num(s['speedup_vs_baseline'], '{:.2f}'):>8}"
            f"{num(s['speedup_vs_previous'], '{:.2f}'):>8}  {s['verdict'] or '-'}"
        )
    return "\n".join(lines)


STEP_KEYS = ("enable_amp", "enable_jit", "kit_xla_flags", "num_devices", "local_batch_size")


def noise_lines(summaries: list[dict]) -> list[str]:
    """Per framework, the spread of SYNTHETIC over the rungs that ran the baseline's train step
    (settings equal in :data:`STEP_KEYS`; only the input differs, which SYNTHETIC does not use): the
    same measurement repeated, so FULL ratios within that spread are noise of this machine."""
    lines = []
    for fw in dict.fromkeys(s["framework"] for s in summaries):
        ran = [s for s in summaries if s["framework"] == fw and s["status"] == "ran" and s["synthetic_samples_per_sec"]]
        ran = [s for s in ran if s.get("values_from", {}).get("synthetic", s["ladder_step"]) == s["ladder_step"]]
        if not ran or ran[0]["ladder_rung"] != "baseline":
            continue
        key = lambda s: [s["ladder_settings"][k] for k in STEP_KEYS]
        same = [s for s in ran if key(s) == key(ran[0])]
        if len(same) < 2:
            continue
        rates = [s["synthetic_samples_per_sec"] for s in same]
        rungs = ", ".join(str(s["ladder_step"]) for s in same)
        lines.append(
            f"{fw}: SYNTHETIC of rungs {rungs} (one train step, only the input differs) spans "
            f"{min(rates):.1f}-{max(rates):.1f} samples/s (x{max(rates) / min(rates):.2f}): "
            "ratios within that spread are this machine's noise"
        )
    return lines


def ladder_figure(summaries: list[dict], path: str | Path, config: str) -> None:
    """The ladder's figure (:func:`dlas_compare.ladder_figure.ladder_axes`: FULL samples/s per rung and
    framework beside the tutorial's A100 ladder), written atomically to ``path`` (PNG)."""
    rungs = [(r.name, r.title) for r in RUNGS]
    fig = ladder_figure_mod.ladder_axes(summaries, rungs, ladder_figure_mod.figure_title(summaries, config))
    ladder_figure_mod.save(fig, path)


def forwarded_config_args(args: argparse.Namespace) -> list[str]:
    """The config options of the ladder's command line for every rung's benchmark, as ``--set``
    (so they never conflict with the rungs' flags).

    Raises:
        UserError: a setting the rungs own (:data:`LADDER_KEYS`) was given.
    """
    sets = [config_mod.parse_override(s) for s in args.set]
    given = [k for k in LADDER_KEYS if getattr(args, k, None) is not None] + [k for k, _ in sets if k in LADDER_KEYS]
    if given:
        raise UserError(f"{given[0]} is set by the ladder's rungs; leave it out (they own {', '.join(LADDER_KEYS)})")
    return config_mod.config_argv(args)


def process_xla_flags(step: Step, environ: dict | None = None) -> str:
    """The ``XLA_FLAGS`` the benchmark process of ``step`` starts with, which a process reads once.
    JAX: :func:`xla_flags` (its rungs before compilation run without the kit's flags, so the
    compilation rung starts a process of its own). TF and PyTorch: the caller's, with which the kit
    adds its flags at import: the flags act on XLA's compilations only, and before TF's compilation
    rung XLA compiles only DALI's crop and copy functions there, which hold no convolution (all that
    ``--xla_gpu_force_conv_nhwc`` changes); PyTorch does not read them. So TF's and PyTorch's rungs
    share one process."""
    if step.framework == "jax":
        return xla_flags(step.settings, environ)
    return (os.environ if environ is None else environ).get("XLA_FLAGS", "")


def run_group(
    steps: Sequence[Step], modes: Sequence[Sequence[str]], common: list[str], timeout: float
) -> tuple[list[dict], str | None, str]:
    """Run the rungs ``steps`` (one framework's, in order) in one benchmark process
    (:func:`dlas_compare.benchmark.run_rungs`), each in its ``modes``; return their records (each with
    its ``ladder_step``), why the process failed (None: it did not; the rungs it finished before
    keep their records) and the ``XLA_FLAGS`` it started with."""
    flags = process_xla_flags(steps[0])
    env = {**os.environ, "XLA_FLAGS": flags}
    fw = steps[0].framework
    with tempfile.TemporaryDirectory(prefix="ladder_") as tmp:
        out, plan_file = Path(tmp) / "records.jsonl", Path(tmp) / "rungs.json"
        entries = []
        for step, rung_modes in zip(steps, modes):
            label = f"{fw} {step.index}. {step.rung.title}"
            args = ["--mode", *rung_modes, *benchmark_args(step.settings), "--label", label]
            entries.append({"args": args, "record": {"ladder_step": step.index}})
            print(f"[ladder]   {label}: {shlex.join(args[:-2])}", flush=True)
        plan_file.write_text(json.dumps(entries))
        cmd = benchmark_command(fw, modes[0], common, out=out, extra=["--rungs", str(plan_file)])
        rungs = ("rungs " if len(steps) > 1 else "rung ") + ", ".join(str(s.index) for s in steps)
        print(f"[ladder] {fw} {rungs} in one process: XLA_FLAGS={shlex.quote(flags)} "
              f"{shlex.join(cmd[1:-4])}", flush=True)  # fmt: skip
        t0 = time.perf_counter()
        records, failure, output = run_process(cmd, out, timeout, env)
        lines = output.splitlines()
        print("\n".join(f"[ladder]     {line}" for line in lines if line.startswith("[benchmark]")), flush=True)
        if failure:
            print("\n".join([line for line in lines if not line.startswith("[benchmark]")][-15:]), flush=True)
    print(f"[ladder] {fw} {rungs}: {failure or 'ok'} in {time.perf_counter() - t0:.0f} s", flush=True)
    return records, failure, flags


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What the ladder runs, in order (each process's rungs together, :func:`make_schedule`): ``order`` every step,
    ``modes`` the modes each step measures (by framework and index), ``want`` the windows asked for,
    ``budget`` seconds (None: no budget), ``reuse`` the benchmark records of the steps an earlier
    ladder ran with the same settings (by framework and index)."""

    order: list[Step]
    modes: dict[tuple[str, int], list[str]]
    want: budget_mod.Windows
    budget: float | None
    reuse: dict[tuple[str, int], list[dict]] = dataclasses.field(default_factory=dict)

    def to_run(self, step: Step) -> bool:
        return step.skip is None and (step.framework, step.index) not in self.reuse

    def groups(self, done: Sequence[tuple[str, int]] = ()) -> list[list[Step]]:
        """The benchmark processes, in order: one framework's consecutive steps to run (less those in
        ``done``) that start with the same ``XLA_FLAGS`` (:func:`process_xla_flags`)."""
        groups: list[list[Step]] = []
        for s in self.order:
            if not self.to_run(s) or (s.framework, s.index) in done:
                continue
            last = groups[-1][-1] if groups else None
            if last and last.framework == s.framework and process_xla_flags(last) == process_xla_flags(s):
                groups[-1].append(s)
            else:
                groups.append([s])
        return groups

    def runs(self, groups: Sequence[Sequence[Step]]) -> list[budget_mod.Run]:
        """The budget's view of ``groups``: each step's framework, rung, modes and whether it starts
        a process."""
        return [
            budget_mod.Run(s.framework, s.rung.name, tuple(self.modes[s.framework, s.index]), i == 0)
            for group in groups
            for i, s in enumerate(group)
        ]

    def windows(
        self, left: float | None, groups: Sequence[Sequence[Step]] | None = None, scale: float = 1.0
    ) -> tuple[budget_mod.Windows, bool]:
        """The windows of the next process with ``left`` seconds of budget for ``groups`` (default:
        all; None left: the wanted windows)."""
        if left is None:
            return self.want, True
        return budget_mod.fit_windows(self.runs(self.groups() if groups is None else groups), left, self.want, scale)


def make_schedule(
    steps: dict[str, list[Step]],
    modes: Sequence[str],
    want: budget_mod.Windows,
    budget: float | None,
    all_modes: bool = False,
    resume: list[dict] = (),
) -> Schedule:
    """The :class:`Schedule` of the planned ``steps``: a framework's rungs run in as few processes as
    :meth:`Schedule.groups` allows, the processes in the order of their first rung, the modes each rung measures
    (:func:`dlas_compare.ladder_budget.modes_of`), and the rungs ``resume`` (the records of an earlier
    ladder, :func:`read_ladder`) ran with the same settings, which are not run again."""
    order = [s for plan_ in steps.values() for s in plan_]
    measured = {(s.framework, s.index): budget_mod.modes_of(s.rung.name, modes, all_modes) for s in order}
    settings = {(s.framework, s.index): dataclasses.asdict(s.settings) for s in order if s.skip is None}
    ran = {
        (r["framework"], r["ladder_step"])
        for r in resume
        if r.get("record") == "ladder_summary" and r["status"] == "ran"
        and settings.get((r["framework"], r["ladder_step"])) == r["ladder_settings"]
    }  # fmt: skip
    reuse = {
        key: [r for r in resume if "mode" in r and (r["framework"], r["ladder_step"]) == key] for key in sorted(ran)
    }
    by_framework = Schedule(order, measured, want, budget, reuse)
    # processes by their first rung, then framework: every framework's ladder starts before any
    # framework's second process (the budget, if short, stops the last); a step that does not run
    # stays after the step of its framework before it
    position = {fw: i for i, fw in enumerate(steps)}
    group_key = {(s.framework, s.index): (g[0].index, position[s.framework]) for g in by_framework.groups() for s in g}
    keys, current = {}, {}
    for s in order:
        before = current.get(s.framework, (s.index, position[s.framework]))
        current[s.framework] = group_key.get((s.framework, s.index), before)
        keys[s.framework, s.index] = (*current[s.framework], position[s.framework], s.index)
    return dataclasses.replace(by_framework, order=sorted(order, key=lambda s: keys[s.framework, s.index]))


def schedule_lines(schedule: Schedule, left: float | None) -> list[str]:
    """What the ladder will run, said before it starts: the processes, the windows, the estimated
    seconds of each rung and in all against ``left`` seconds of budget, and every skipped rung with
    its reason."""
    windows, fits = schedule.windows(left)
    groups = schedule.groups()
    runs = schedule.runs(groups)
    steps = [s for group in groups for s in group]
    est = {(s.framework, s.index): budget_mod.estimate(dataclasses.replace(r, new_process=False), windows)
           for s, r in zip(steps, runs)}  # fmt: skip
    total = budget_mod.total(runs, windows)
    cut, elapsed = [], 0.0
    for s, r in zip(steps, runs):
        elapsed += budget_mod.estimate(r, windows)
        if left is not None and elapsed > left:
            cut.append(f"{s.framework} {s.index}")
    floor = f"at least {windows.min_steps} steps each"
    head = (
        f"schedule: {len(steps)} rungs run in {len(groups)} processes, {len(schedule.reuse)} taken from --resume, "
        f"{len(schedule.order) - len(steps) - len(schedule.reuse)} skipped; timed windows "
        f"{windows.windows} x {windows.window_sec:g} s per mode ({floor}); estimated {total:.0f} s"
    )
    if left is not None:
        head += f" of the {left:.0f} s left of --budget_sec {schedule.budget:.0f}"
        if not fits:
            head += " (over it even at the smallest windows: the budget stops the last rungs"
            head += f", by the estimate {', '.join(cut)})"
        elif windows != schedule.want:
            head += f" (windows trimmed from {schedule.want.windows} x {schedule.want.window_sec:g} s)"
    lines = [head + "; set-up times estimated from one H200 and rescaled as processes end"]
    first = {(g[0].framework, g[0].index): g for g in groups}
    for s in schedule.order:
        key = (s.framework, s.index)
        if key in first:
            g = first[key]
            start = budget_mod.setup_sec(s.framework, "", True) - budget_mod.setup_sec(s.framework, "")
            lines.append(f"  {s.framework} process (rungs {', '.join(str(t.index) for t in g)}): "
                         f"XLA_FLAGS={shlex.quote(process_xla_flags(s))}, ~{start:.0f} s to start")  # fmt: skip
        label = f"  {s.framework} {s.index}. {s.rung.title}: "
        if schedule.to_run(s):
            lines.append(label + f"{' '.join(schedule.modes[key])}, ~{est[key]:.0f} s")
        elif s.skip is None:
            lines.append(label + "ran in the --resume ladder with these settings: its records are reused")
        else:
            lines.append(label + f"skipped: {s.skip}")
    return lines


def _split(records: list[dict], steps: Sequence[Step], modes: dict) -> tuple[dict, dict]:
    """The records of each of ``steps`` by index (their ``ladder_step``): those of the steps that have
    every mode they measure (None for the others), and all of them."""
    by = {s.index: [r for r in records if r.get("ladder_step") == s.index] for s in steps}
    complete = lambda s: {r["mode"] for r in by[s.index]} >= set(modes[s.framework, s.index])
    return {s.index: by[s.index] if complete(s) else None for s in steps}, by


def run_ladder(
    schedule: Schedule,
    common: list[str],
    out: Path,
    timeout: float,
    config: str,
    start: float | None = None,
    runner=None,
    clock=time.perf_counter,
) -> list:
    """Run ``schedule``'s steps in its order, each framework's in as few processes as
    :meth:`Schedule.groups` allows, with the benchmark flags ``common`` and the windows that fit what
    is left of the budget (fitted again before each process), appending each rung's records and
    summary to ``out`` as its process ends; return the summaries. Once the budget has passed since
    ``start`` (``clock()``; default now), the remaining rungs are skipped and a running process is
    stopped. A process that fails loses only the rung it was in: the rungs after it run in a new
    process. ``config`` names the config in the summaries; ``runner`` (default :func:`run_group`)
    runs one process. ``timeout`` is seconds per rung."""
    runner = runner or run_group
    budget = schedule.budget
    ladder_id = f"{platform.node()} {datetime.datetime.now().isoformat(timespec='seconds')}"
    ran: dict[str, list[dict]] = {}
    outcome: dict[tuple[str, int], dict] = {}
    summaries, done = [], []
    t0 = clock() if start is None else start
    for step in schedule.order:
        fw, key = step.framework, (step.framework, step.index)
        if schedule.to_run(step) and key not in outcome:
            left = None if budget is None else budget - (clock() - t0)
            groups = schedule.groups(done=list(outcome))
            if left is not None and left <= 0:
                spent = f"the ladder's time budget (--budget_sec {budget:.0f}) was spent"
                outcome.update({(s.framework, s.index): {"status": "skipped", "reason": spent} for s in groups[0]})
            else:
                failed_before = any(o["status"] == "failed" for (f, _), o in outcome.items() if f == fw)
                outcome.update(
                    _run_process(schedule, groups, common, timeout, left, runner, clock, done, failed_before)
                )
        records, status, reason, extra = [], "skipped", step.skip, {}
        if key in schedule.reuse:
            records = [dict(r) for r in schedule.reuse[key]]
            status, extra["resumed_from"] = "ran", records[0]["ladder_id"] if records else None
        elif key in outcome:
            got = outcome[key]
            records, status, reason = got.get("records", []), got["status"], got.get("reason")
            extra = {k: got.get(k) for k in ("rung_sec", "process_sec", "process_rungs", "windows")}
        for r in records:
            r["ladder_id"] = ladder_id
        summary = summarize(step, records, status, reason, ran.setdefault(fw, []))
        summary.update({"resumed_from": None, "rung_sec": None, "process_sec": None, "process_rungs": None,
                        "windows": None, **extra})  # fmt: skip
        summary.update(
            config=config,
            ladder_id=ladder_id,
            command=shlex.join(sys.argv),
            date=datetime.datetime.now().isoformat(timespec="seconds"),
        )
        if status == "ran":
            ran[fw].append(summary)
        summaries.append(summary)
        append_records(out, records + [summary])
        print(f"[ladder] {summary['line']}", flush=True)
    return summaries


def _run_process(schedule, groups, common, timeout, left, runner, clock, done, failed_before=False) -> dict:
    """Run the first of ``groups`` in one process with the windows that fit ``left`` seconds for all
    of ``groups``; return each of its steps' outcome (records, status, reason, seconds, windows),
    none for the steps after a failed one (the ladder runs them in a new process), unless the
    framework had failed before (``failed_before``) and this process finished no rung either: then
    every step fails with its reason (a process that cannot start is not started once per rung).
    ``done`` collects (estimated, observed) set-up seconds of the processes that ran all their rungs."""
    group, budget = groups[0], schedule.budget
    windows, _ = schedule.windows(left, groups, budget_mod.observed_scale(done))
    modes = [schedule.modes[s.framework, s.index] for s in group]
    limit = timeout * len(group) if left is None else min(timeout * len(group), left)
    t1 = clock()
    records, failure, flags = runner(group, modes, [*common, *windows.args()], limit)
    took = clock() - t1
    complete, by = _split(records, group, schedule.modes)
    result, rungs = {}, [s.index for s in group]
    for s in group:
        got = complete[s.index]
        base = {"process_sec": took, "process_rungs": rungs, "windows": dataclasses.asdict(windows)}
        for r in by[s.index]:
            r.update(ladder_step=s.index, ladder_rung=s.rung.name)
            r.update(ladder_settings=dataclasses.asdict(s.settings), ladder_xla_flags=flags)
        if got is not None:
            result[s.framework, s.index] = {"records": got, "status": "ran", "rung_sec": got[0].get("rung_sec"), **base}
            continue
        reason = failure or "its process ended without its records"
        status = "failed"
        if failure and failure.startswith("timed out") and left is not None and limit < timeout * len(group):
            status, reason = "stopped", f"the ladder's time budget (--budget_sec {budget:.0f}) ran out during it"
        result[s.framework, s.index] = {"records": by[s.index], "status": status, "reason": reason, **base}
        if status == "failed" and failed_before and s is group[0]:
            result.update({(t.framework, t.index): {"status": "failed", "reason": reason, **base} for t in group[1:]})
        if status == "stopped":
            spent = f"the ladder's time budget (--budget_sec {budget:.0f}) was spent"
            after = group[group.index(s) + 1 :]
            result.update({(t.framework, t.index): {"status": "skipped", "reason": spent} for t in after})
        break
    ran_all = all(result.get((s.framework, s.index), {}).get("status") == "ran" for s in group)
    if ran_all:
        run_list = schedule.runs([group])
        est = sum(budget_mod.setup_sec(r.framework, r.rung, r.new_process) for r in run_list)
        timed = sum(budget_mod.window_cost(r.rung, m, windows) for r in run_list for m in r.modes)
        done.append((est, max(took - timed, 0.0)))
    return result


def read_ladder(path: Path, flag: str = "--replot") -> list[dict]:
    """Every record (benchmark records and summaries) of the last ladder in the JSON lines file
    ``path``; ``flag`` names the option in errors.

    Raises:
        UserError: the file is missing, not JSON lines, or holds no ladder summary.
    """
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{flag} {path}: expected a JSON lines file written by the ladder ({err})") from None
    records = [r for r in records if isinstance(r, dict) and "ladder_id" in r]
    summaries = [r for r in records if r.get("record") == "ladder_summary"]
    if not summaries:
        raise UserError(f'{flag} {path}: no ladder summary records ("record": "ladder_summary") in it')
    last = summaries[-1]["ladder_id"]
    return [r for r in records if r["ladder_id"] == last]


def read_summaries(path: Path) -> list[dict]:
    """The summary records of the last ladder in ``path`` (:func:`read_ladder`)."""
    return [r for r in read_ladder(path) if r.get("record") == "ladder_summary"]


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("dlas_compare.ladder", __doc__.split("\n\n")[0])
    config_mod.add_config_args(p)
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
        help="take the rungs that ran in the last ladder in JSONL with the same settings from it, run the rest",
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
        ladder_figure(summaries, figure, summaries[0]["config"])
        print(f"wrote {figure}")
        return 0
    if "full" not in args.modes:
        raise UserError("--modes must include full: the ladder's speedups are FULL samples/s")
    common = forwarded_config_args(args)
    common += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    cfg = config_mod.config_from_args(args)
    train = cfg.data_file("train")
    if not train.is_file():
        raise DatasetError(
            f"config {cfg.name!r} reads {train}, which does not exist "
            f"({command_name('shared_data.data.generate')} --out {train} --size 128 --seed 1 --npy)"
        )
    out = Path(args.out or f"runs/ladder/{cfg.name}.jsonl")
    figure = Path(args.figure or out.with_suffix(".png"))
    resume = read_ladder(Path(args.resume), "--resume") if args.resume else []
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
    ladder_figure(summaries, figure, cfg.name)
    print(f"wrote {out} and {figure}")
    return 1 if any(s["status"] == "failed" for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
