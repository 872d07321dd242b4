"""What the ladder runs and in which order (:func:`make_schedule`): a framework's rungs in as few
benchmark processes as their ``XLA_FLAGS`` allow, the modes each rung measures, the rungs a
``--resume`` ladder already ran, the timed windows that fit the budget, and the schedule said up
front (:func:`schedule_lines`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from dlas_compare import ladder_budget as budget_mod
from dlas_compare.ladder_rungs import Step, process_xla_flags


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
        ``done``) that start with the same ``XLA_FLAGS`` (:func:`process_xla_flags`) and make the same
        CPU devices (``host_devices``: a process sets its devices once)."""
        groups: list[list[Step]] = []
        for s in self.order:
            if not self.to_run(s) or (s.framework, s.index) in done:
                continue
            last = groups[-1][-1] if groups else None
            same_devices = last and last.settings.host_devices == s.settings.host_devices  # set once per process
            if (
                last
                and last.framework == s.framework
                and same_devices
                and process_xla_flags(last) == process_xla_flags(s)
            ):
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
