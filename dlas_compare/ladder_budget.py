"""The ladder's time budget: what each rung measures, how long its set-up and windows take, and the
timed windows that make every planned rung fit ``--budget_sec``.

A framework's rungs run in as few benchmark processes as its settings allow (``dlas_compare.ladder``
groups them; ``dlas_compare.benchmark --rungs`` runs a group): a process starts once
(:data:`PROCESS_SEC`: Python, the framework's import, GPU and DALI set-up), then each rung adds its
own set-up (:data:`SETUP_SEC`: compiling or autotuning a train step the process has not built yet,
starting its input pipeline, stopping it), in IO and FULL a drain of what the pipeline read ahead
(:data:`DRAIN_STEPS`), and its timed windows. A window holds at least :data:`MIN_STEPS` steps
however long they take (:data:`STEP_SEC`), so a slow rung's window means something; the budget
shares what is left after the set-up among the windows, trimming ``--window_sec`` (and
``--windows``, down to :data:`FLOOR`) rather than dropping rungs, so the fast rungs' windows shrink
first and the slow ones' floors stay. Before each process the windows are fitted again, with the
set-up estimates scaled by what the processes that ran took.

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
#: GPU and DALI set-up, the data file's checks. From the ladder's processes on one H200 (two calls):
#: the process's seconds outside its rungs (2-3 s) plus its first rung's seconds outside that rung's
#: compilation, warm-up and windows, less ~1.5 s of the rung's own: JAX 13 and 15 s, TF 30 s,
#: PyTorch 13 and 15 s.
PROCESS_SEC = {"jax": 15.0, "tf": 30.0, "torch": 15.0}
#: seconds of a rung outside its drains and timed windows in a process that ran the rungs before it
#: (``short_opt``, batch 64, the modes of :data:`CHANGED_MODES`): its ``rung_sec`` less its windows
#: (steps x batch / samples/s) in the ladder's records on one H200, less the process's start in a
#: first rung and the warm-up steps beyond 2 that drained DALI's queue then (~1 s). Mostly building
#: its train step where the process has none with the same precision and compilation
#: (``compile_sec``: JAX fp32 23 s, bf16 29 s, compiled 18 s; TF 16.5 s, bf16 8 s, XLA 32 s;
#: PyTorch's cudnn.benchmark autotuning 55 s fp32, 32 s bf16), two warm-up steps per mode (a new
#: lowmem pipeline's first batches ~4-7 s, DALI's ~1-3 s), making and stopping pipelines (TF's 8
#: lowmem workers ~12 s) and ~1-2 s of the model's and records' own.
SETUP_SEC = {
    "jax": {"baseline": 29, "workers": 7, "dali": 2, "amp": 36, "compile": 19, "device": 3, "data_parallel": 40},
    "tf": {"baseline": 27, "workers": 20, "dali": 3, "amp": 18, "compile": 44, "device": 3, "data_parallel": 50},
    "torch": {"baseline": 63, "workers": 12, "dali": 2, "amp": 35, "compile": 40, "device": 10, "data_parallel": 60},
}
DEFAULT_PROCESS_SEC = 20.0
DEFAULT_SETUP_SEC = 30.0
#: seconds per step on one H200 (``short_opt``, batch 64) of the input modes (IO, FULL) and of
#: SYNTHETIC, per rung: lowmem with 4 or 8 workers ~75-100 samples/s (its reads do not scale with
#: threads: h5py holds one lock per process for each read); DALI ~520-790; FULL with bf16 ~610-750,
#: compiled ~680-700; GPU-resident input ~3500; the fp32 step ~650-1340 samples/s, bf16 ~1000-2340,
#: compiled ~3700
STEP_SEC = {
    "baseline": (0.85, 0.1),
    "workers": (0.85, 0.1),
    "dali": (0.12, 0.1),
    "amp": (0.11, 0.065),
    "compile": (0.1, 0.02),
    "device": (0.02, 0.02),
    "data_parallel": (0.12, 0.05),
}
#: input steps a drain costs before an IO or FULL mode's windows (:func:`dlas_compare.benchmark_timing.drain`):
#: the call that waits on the loader, and the queue's fast calls or an empty queue's pause, about one
#: more. A FULL step less than :data:`DRAIN_WAIT_RATIO` times faster than its loader is never seen
#: waiting: that drain runs to its cap, :data:`DRAIN_CAP_STEPS` (DALI's depth 4 + 4 on one H200)
DRAIN_STEPS = 2
DRAIN_CAP_STEPS = 8
DRAIN_WAIT_RATIO = 3.0  # dlas_compare.benchmark_timing.DRAIN_WAIT_RATIO
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
    """Estimated seconds of one mode's timed windows, each ``window_sec`` or ``min_steps`` steps of
    :data:`STEP_SEC`, whichever is longer, and in IO and FULL the drain before them
    (:func:`drain_steps`)."""
    step_in, step_synthetic = STEP_SEC.get(rung, (0.1, 0.1))
    step = step_synthetic if mode == "synthetic" else step_in
    return drain_steps(rung, mode) * step + windows.windows * max(windows.window_sec, windows.min_steps * step)


def drain_steps(rung: str, mode: str) -> int:
    """Steps of the drain before ``mode``'s windows (:data:`DRAIN_STEPS`, :data:`DRAIN_CAP_STEPS`; none
    in SYNTHETIC)."""
    if mode == "synthetic":
        return 0
    step_in, step_synthetic = STEP_SEC.get(rung, (0.1, 0.1))
    return DRAIN_CAP_STEPS if mode == "full" and step_in < DRAIN_WAIT_RATIO * step_synthetic else DRAIN_STEPS


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
