"""The ladder's time budget: what each rung measures, how long its set-up and windows take, and the
timed windows that make every planned rung fit ``--budget_sec``.

A framework's rungs run in as few benchmark processes as its settings allow (``dlas_compare.ladder``
groups them; ``dlas_compare.benchmark --rungs`` runs a group): a process starts once
(:data:`PROCESS_SEC`: Python, the framework's import, GPU and DALI set-up), then each rung adds its
own set-up (:data:`SETUP_SEC`: compiling or autotuning a train step the process has not built yet,
starting its input pipeline and draining what it read ahead, stopping it) and its timed windows. A
window holds at least :data:`MIN_STEPS` steps however long they take (:data:`STEP_SEC`), so a slow
rung's window means something; the budget shares what is left after the set-up among the windows,
trimming ``--window_sec`` (and ``--windows``, down to :data:`FLOOR`) rather than dropping rungs, so
the fast rungs' windows shrink first and the slow ones' floors stay. Before each process the windows
are fitted again, with the set-up estimates scaled by what the processes that ran took.

A rung measures the modes its change can move (:data:`CHANGED_MODES`): a new input (workers, DALI,
GPU-resident) its IO and FULL, a new train step (precision, compilation) its SYNTHETIC and FULL; the
others are the previous rung's, named as such in its summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

#: the modes each rung measures when the ladder measures what changed (FULL always)
CHANGED_MODES = {
    "baseline": ("io", "synthetic", "full"),
    "workers": ("io", "full"),
    "dali": ("io", "full"),
    "amp": ("synthetic", "full"),
    "compile": ("synthetic", "full"),
    "device": ("io", "full"),
    "data_parallel": ("io", "synthetic", "full"),
}

#: seconds to start one benchmark process on one H200 (``short_opt``): Python, the framework's import,
#: GPU and DALI set-up, the data file's checks. From the ladder's rung-3 processes (DALI: no compile,
#: warm-up of ~1 s): JAX 21 s, TF 54 s, PyTorch 76 s, less their compile/autotune (1, 18, 52 s),
#: warm-up and windows.
PROCESS_SEC = {"jax": 15.0, "tf": 28.0, "torch": 18.0}
#: seconds of a rung outside its timed windows in a process that ran the rungs before it (``short_opt``,
#: batch 64, the modes of :data:`CHANGED_MODES`): building its train step where the process has none
#: with the same precision and compilation (``compile_sec`` of the records: JAX fp32 24 s, bf16 32 s;
#: TF 18 s, bf16 10 s + 4 s, its XLA step ~45 s (stopped at 63 s in one process with its set-up);
#: PyTorch's cudnn.benchmark autotuning 58 s fp32, 36 s bf16), two warm-up steps per mode (~1 s
#: each on lowmem; a new DALI pipeline drains its prefetch, :func:`dlas_compare.benchmark.read_ahead`),
#: making and stopping a pipeline (the lowmem workers finish their pending reads, ~4 s), and ~2 s of
#: the model's and records' own.
SETUP_SEC = {
    "jax": {"baseline": 36, "workers": 12, "dali": 5, "amp": 36, "compile": 35, "device": 10, "data_parallel": 40},
    "tf": {"baseline": 26, "workers": 10, "dali": 10, "amp": 16, "compile": 48, "device": 12, "data_parallel": 50},
    "torch": {"baseline": 66, "workers": 12, "dali": 5, "amp": 40, "compile": 40, "device": 10, "data_parallel": 60},
}
DEFAULT_PROCESS_SEC = 20.0
DEFAULT_SETUP_SEC = 30.0
#: seconds per step on one H200 (``short_opt``, batch 64) of the input modes (IO, FULL) and of
#: SYNTHETIC, per rung: lowmem with 4 workers ~62-100 samples/s, with 8 ~55; DALI ~550-700; the
#: fp32 step ~650-1340 samples/s, bf16 ~1000-2350, compiled ~3700, GPU-resident input ~3400
STEP_SEC = {
    "baseline": (1.05, 0.1),
    "workers": (1.2, 0.1),
    "dali": (0.12, 0.1),
    "amp": (0.12, 0.065),
    "compile": (0.12, 0.05),
    "device": (0.03, 0.05),
    "data_parallel": (0.12, 0.05),
}
MIN_STEPS = 5  # the fewest steps a timed window holds: several loader workers' batches, not one arrival
SCALE_RANGE = (0.25, 4.0)  # how far the observed set-up times may rescale the table


@dataclasses.dataclass(frozen=True)
class Windows:
    """Timed windows of one mode: ``windows`` of about ``window_sec`` seconds (at most, for a slow
    step: the window holds ``min_steps`` steps at least)."""

    windows: int
    window_sec: float
    min_steps: int = MIN_STEPS

    def args(self) -> list[str]:
        return [
            "--windows",
            str(self.windows),
            "--window_sec",
            f"{self.window_sec:.2f}",
            "--min_window_steps",
            str(self.min_steps),
        ]


FLOOR = Windows(2, 0.5)  # two windows keep a min-max; half a second holds a few steps of the full net


@dataclasses.dataclass(frozen=True)
class Run:
    """One rung to run: ``framework``, ``rung`` (name), the ``modes`` it measures, and whether it
    starts a new benchmark process (``new_process``)."""

    framework: str
    rung: str
    modes: tuple[str, ...]
    new_process: bool = False


def modes_of(rung: str, modes: Sequence[str], all_modes: bool = False) -> list[str]:
    """The modes of ``modes`` (in their order) that ``rung`` measures: all with ``all_modes``, else
    those its change can move (:data:`CHANGED_MODES`)."""
    return [m for m in modes if all_modes or m in CHANGED_MODES[rung]]


def setup_sec(framework: str, rung: str, new_process: bool = False) -> float:
    """The estimated seconds of a rung outside its windows (:data:`SETUP_SEC`), plus the process's
    start (:data:`PROCESS_SEC`) when it starts one."""
    start = PROCESS_SEC.get(framework, DEFAULT_PROCESS_SEC) if new_process else 0.0
    return start + float(SETUP_SEC.get(framework, {}).get(rung, DEFAULT_SETUP_SEC))


def window_cost(rung: str, mode: str, windows: Windows) -> float:
    """Estimated seconds of one mode's timed windows: each lasts ``window_sec`` or ``min_steps``
    steps of :data:`STEP_SEC`, whichever is longer."""
    step = STEP_SEC.get(rung, (0.1, 0.1))[mode == "synthetic"]
    return windows.windows * max(windows.window_sec, windows.min_steps * step)


def estimate(run: Run, windows: Windows, scale: float = 1.0) -> float:
    """Estimated seconds of one rung: its set-up (and its process's start) times ``scale`` plus its
    timed windows."""
    return scale * setup_sec(run.framework, run.rung, run.new_process) + sum(
        window_cost(run.rung, m, windows) for m in run.modes
    )


def total(runs: Sequence[Run], windows: Windows, scale: float = 1.0) -> float:
    """Estimated seconds of ``runs`` with ``windows``."""
    return sum(estimate(r, windows, scale) for r in runs)


def fit_windows(runs: Sequence[Run], left: float, want: Windows, scale: float = 1.0) -> tuple[Windows, bool]:
    """The largest windows, at most ``want`` and at least :data:`FLOOR` (with ``want.min_steps``),
    with which ``runs`` fit ``left`` seconds; and whether they fit at all (False: the floor's
    windows, and the budget will stop the last rungs).

    ``want.windows`` is kept while windows of at least the floor's seconds fit, then lowered to the
    floor's count; seconds are trimmed in hundredths. Windows held up by ``min_steps`` slow steps
    cost the same at any ``window_sec``, so trimming shortens the fast rungs' windows only."""
    if total(runs, want, scale) <= left:
        return want, True
    floor_sec = min(FLOOR.window_sec, want.window_sec)
    for count in sorted({want.windows, FLOOR.windows}, reverse=True):
        if total(runs, Windows(count, floor_sec, want.min_steps), scale) > left:
            continue
        if total(runs, Windows(count, want.window_sec, want.min_steps), scale) <= left:
            return Windows(count, want.window_sec, want.min_steps), True
        lo, hi = round(floor_sec * 100), round(want.window_sec * 100)  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if total(runs, Windows(count, mid / 100, want.min_steps), scale) <= left else (lo, mid)
        return Windows(count, lo / 100, want.min_steps), True
    return Windows(FLOOR.windows, floor_sec, want.min_steps), False


def observed_scale(done: Sequence[tuple[float, float]]) -> float:
    """The ratio of the set-up seconds the processes that ran took to the table's (``done``: estimated,
    observed set-up seconds of each), within :data:`SCALE_RANGE`; 1 before any ran."""
    estimated = sum(e for e, _ in done)
    if not done or estimated <= 0:
        return 1.0
    return min(max(sum(o for _, o in done) / estimated, SCALE_RANGE[0]), SCALE_RANGE[1])
