"""The ladder's time budget: what each rung measures, how long its process takes, and the timed windows
that make every planned rung fit ``--budget_sec``.

A rung's benchmark process spends most of its time outside the timed windows: start, imports, model,
compilation (cold for a new train step, a persistent-cache read for one seen before), the loaders'
start and the warm-up that drains their read-ahead. :data:`SETUP_SEC` holds those seconds per
framework and rung on one H200; the budget then shares what is left among the timed windows, trimming
``--window_sec`` (and ``--windows``, down to :data:`FLOOR`) rather than dropping rungs. Before every
rung the windows are fitted again, with the set-up estimates scaled by what the rungs that ran took,
so a machine slower or faster than the table still ends inside the budget where it can. A recorded
ladder's summaries hold each rung's ``process_sec`` and ``windows``, from which the table is refreshed.

A rung measures the modes its change can move (:data:`CHANGED_MODES`): a new input (workers, DALI,
GPU-resident) its IO and FULL, a new train step (precision, compilation) its SYNTHETIC and FULL; the
others are the previous rung's, named as such in its summary.
"""

from __future__ import annotations

import dataclasses
import math
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

#: seconds of a rung's process outside its timed windows on one H200 (``short_opt``, batch 64, the
#: modes of :data:`CHANGED_MODES`). JAX's rungs 1-4: the recorded JAX ladder's process times less their
#: windows (rung 2 less its SYNTHETIC mode too); its compilation rung compiles cold like rung 4, its
#: GPU-resident rung reads its compile from the cache. PyTorch: its recorded baseline (a first step of
#: 60 s in fp32 for cudnn.benchmark's autotuning, which every new process repeats). TF: its cold XLA
#: compile (~38 s, then ~5 s from its cache) on the JAX rungs' loader times.
SETUP_SEC = {
    "jax": {"baseline": 55, "workers": 62, "dali": 18, "amp": 42, "compile": 42, "device": 20, "data_parallel": 45},
    "tf": {"baseline": 65, "workers": 65, "dali": 30, "amp": 40, "compile": 60, "device": 25, "data_parallel": 55},
    "torch": {"baseline": 95, "workers": 100, "dali": 80, "amp": 60, "compile": 60, "device": 40, "data_parallel": 100},
}
DEFAULT_SETUP_SEC = 45.0
SCALE_RANGE = (0.25, 4.0)  # how far the observed set-up times may rescale the table


@dataclasses.dataclass(frozen=True)
class Windows:
    """Timed windows of one mode: ``windows`` of about ``window_sec`` seconds."""

    windows: int
    window_sec: float

    def args(self) -> list[str]:
        return ["--windows", str(self.windows), "--window_sec", f"{self.window_sec:.2f}"]


FLOOR = Windows(2, 0.5)  # two windows keep a min-max; half a second holds a few steps of the full net


def modes_of(rung: str, modes: Sequence[str], all_modes: bool = False) -> list[str]:
    """The modes of ``modes`` (in their order) that ``rung`` measures: all with ``all_modes``, else
    those its change can move (:data:`CHANGED_MODES`)."""
    return [m for m in modes if all_modes or m in CHANGED_MODES[rung]]


def setup_sec(framework: str, rung: str) -> float:
    """The estimated seconds of a rung's process outside its windows (:data:`SETUP_SEC`)."""
    return float(SETUP_SEC.get(framework, {}).get(rung, DEFAULT_SETUP_SEC))


def estimate(framework: str, rung: str, n_modes: int, windows: Windows, scale: float = 1.0) -> float:
    """Estimated seconds of one rung: its set-up times ``scale`` plus its timed windows."""
    return scale * setup_sec(framework, rung) + n_modes * windows.windows * windows.window_sec


def fit_windows(
    runs: Sequence[tuple[str, str, int]], left: float, want: Windows, scale: float = 1.0
) -> tuple[Windows, bool]:
    """The largest windows, at most ``want`` and at least :data:`FLOOR`, with which the rungs ``runs``
    (framework, rung, modes measured) fit ``left`` seconds; and whether they fit at all (False: the
    floor's windows, and the budget will stop the last rungs).

    ``want.windows`` is kept while windows of at least the floor's seconds fit, then lowered to the
    floor's count."""
    fixed = sum(scale * setup_sec(fw, rung) for fw, rung, _ in runs)
    slots = sum(n for _, _, n in runs)
    if not slots:
        return want, fixed <= left
    per_mode = (left - fixed) / slots
    for count in sorted({want.windows, FLOOR.windows}, reverse=True):
        sec = min(want.window_sec, per_mode / count)
        if sec >= FLOOR.window_sec:
            return Windows(count, math.floor(sec * 100) / 100 if sec < want.window_sec else want.window_sec), True
    return FLOOR, False


def observed_scale(done: Sequence[tuple[str, str, float]]) -> float:
    """The ratio of the set-up seconds the rungs that ran took to the table's (``done``: framework,
    rung, observed set-up seconds), within :data:`SCALE_RANGE`; 1 before any ran."""
    if not done:
        return 1.0
    ratio = sum(sec for _, _, sec in done) / sum(setup_sec(fw, rung) for fw, rung, _ in done)
    return min(max(ratio, SCALE_RANGE[0]), SCALE_RANGE[1])
