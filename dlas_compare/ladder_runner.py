"""Running a :class:`dlas_compare.ladder_schedule.Schedule`: one benchmark process per group of rungs
(:func:`run_group`), each rung's records and summary appended to the ladder's file as soon as its
process ends, the budget enforced (:func:`run_ladder`); and reading a ladder's file back
(:func:`read_ladder`, for ``--replot`` and ``--resume``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dlas_compare import ladder_budget as budget_mod
from dlas_compare.benchmark import append_records, run_process
from dlas_compare.ladder_rungs import LADDER_KEYS, Step, benchmark_args, process_xla_flags
from dlas_compare.ladder_schedule import Schedule
from dlas_compare.ladder_verdicts import summarize
from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.core.errors import UserError
from shared_data.runtime.cli import benchmark_command


def run_group(
    steps: Sequence[Step], modes: Sequence[Sequence[str]], common: list[str], timeout: float, progress=None
) -> tuple[list[dict], str | None, str]:
    """Run the rungs ``steps`` (one framework's, in order) in one benchmark process
    (:func:`dlas_compare.benchmark.run_rungs`), each in its ``modes``; return their records (each with
    its ``ladder_step``), why the process failed (None: it did not; the rungs it finished before
    keep their records) and the ``XLA_FLAGS`` it started with. ``progress`` (optional) is called with
    the records so far each time the process finishes a rung."""
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
        # the process's stages and progress as they come, not minutes of silence
        records, failure, output = run_process(cmd, out, timeout, env, echo="[ladder]     ", progress=progress)
        lines = output.splitlines()
        if failure:
            print("\n".join([line for line in lines if not line.startswith("[benchmark]")][-15:]), flush=True)
    print(f"[ladder] {fw} {rungs}: {failure or 'ok'} in {time.perf_counter() - t0:.0f} s", flush=True)
    return records, failure, flags


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
    summary to ``out`` as soon as the rung finishes (while its process goes on to the next), so a
    failure, of a process or of the ladder, loses at most the rung it was in; return the summaries.
    Once the budget has passed since ``start`` (``clock()``; default now), the remaining rungs are
    skipped and a running process is stopped. A process that fails loses only the rung it was in: the
    rungs after it run in a new process. ``config`` names the config in the summaries; ``runner``
    (default :func:`run_group`) runs one process. ``timeout`` is seconds per rung.

    Raises:
        UserError: ``out`` cannot be written (the rungs written before stay in it).
    """
    runner = runner or run_group
    budget = schedule.budget
    ladder_id = f"{platform.node()} {datetime.datetime.now().isoformat(timespec='seconds')}"
    ran: dict[str, list[dict]] = {}
    outcome: dict[tuple[str, int], dict] = {}
    summaries, done, written = [], [], set()

    def write(step: Step) -> None:
        fw, key = step.framework, (step.framework, step.index)
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
        written.add(key)
        write_records(out, records + [summary])
        print(f"[ladder] {summary['line']}", flush=True)

    def write_ready() -> None:
        """Write, in the schedule's order, every step whose outcome is known, up to the first that
        has still to run."""
        for step in schedule.order:
            key = (step.framework, step.index)
            if key in written:
                continue
            if schedule.to_run(step) and key not in outcome:
                return
            write(step)

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
                kept = lambda finished: (outcome.update(finished), write_ready())
                got = _run_process(schedule, groups, common, timeout, left, runner, clock, done, failed_before, kept)
                outcome.update({k: v for k, v in got.items() if k not in written})
        write_ready()
    return summaries


def write_records(path: Path, records: list[dict]) -> None:
    """Append ``records`` to the ladder's file ``path`` (:func:`dlas_compare.benchmark.append_records`).

    Raises:
        UserError: the file cannot be written (a full disk, a read-only folder), with what it holds.
    """
    try:
        append_records(path, records)
    except OSError as err:
        if path.is_file() and path.stat().st_size > 0:
            kept = "the rungs written before this one are in it, --resume it to run the rest"
        else:
            kept = "no rung is in it"
        raise UserError(f"--out {path}: cannot write the ladder's records ({err.strerror or err}); {kept}") from None


def _annotate(step: Step, records: list[dict], flags: str) -> None:
    for r in records:
        r.update(ladder_step=step.index, ladder_rung=step.rung.name)
        r.update(ladder_settings=dataclasses.asdict(step.settings), ladder_xla_flags=flags)


def _run_process(schedule, groups, common, timeout, left, runner, clock, done, failed_before=False, kept=None) -> dict:
    """Run the first of ``groups`` in one process with the windows that fit ``left`` seconds for all
    of ``groups``; return each of its steps' outcome (records, status, reason, seconds, windows),
    none for the steps after a failed one (the ladder runs them in a new process), unless the
    framework had failed before (``failed_before``) and this process finished no rung either: then
    every step fails with its reason (a process that cannot start is not started once per rung).
    ``kept`` (optional) is called with the outcomes of the rungs the process finishes, as each
    finishes (their ``process_sec``: seconds from the process's start to the rung's end).
    ``done`` collects (estimated, observed) set-up seconds of the processes that ran all their rungs."""
    group, budget = groups[0], schedule.budget
    windows, _ = schedule.windows(left, groups, budget_mod.observed_scale(done))
    modes = [schedule.modes[s.framework, s.index] for s in group]
    limit = timeout * len(group) if left is None else min(timeout * len(group), left)
    rungs = [s.index for s in group]
    base = {"process_rungs": rungs, "windows": dataclasses.asdict(windows)}
    finished: dict[tuple[str, int], dict] = {}

    def progress(records: list[dict]) -> None:
        complete, _ = _split(records, group, schedule.modes)
        new = {}
        for s in group:
            got = complete[s.index]
            if got is None:
                break
            if (s.framework, s.index) not in finished:
                _annotate(s, got, process_xla_flags(s))
                rung = {"records": got, "status": "ran", "rung_sec": got[0].get("rung_sec")}
                new[s.framework, s.index] = {**rung, "process_sec": clock() - t1, **base}
        finished.update(new)
        if new and kept is not None:
            kept(new)

    t1 = clock()
    records, failure, flags = runner(group, modes, [*common, *windows.args()], limit, progress)
    took = clock() - t1
    complete, by = _split(records, group, schedule.modes)
    result = {}
    for s in group:
        got = complete[s.index]
        if (s.framework, s.index) in finished:
            result[s.framework, s.index] = finished[s.framework, s.index]
            continue
        _annotate(s, by[s.index], flags)
        if got is not None:
            rung = {"records": got, "status": "ran", "rung_sec": got[0].get("rung_sec")}
            result[s.framework, s.index] = {**rung, "process_sec": took, **base}
            continue
        reason = failure or "its process ended without its records"
        status = "failed"
        if failure and failure.startswith("timed out") and left is not None and limit < timeout * len(group):
            status, reason = "stopped", f"the ladder's time budget (--budget_sec {budget:.0f}) ran out during it"
        result[s.framework, s.index] = {"records": by[s.index], "status": status, "reason": reason,
                                        "process_sec": took, **base}  # fmt: skip
        if status == "failed" and failed_before and s is group[0]:
            result.update({(t.framework, t.index): {"status": "failed", "reason": reason, "process_sec": took,
                                                    **base} for t in group[1:]})  # fmt: skip
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
        UserError: the file is missing, not text (a binary file), not JSON lines, or holds no ladder
            summary.
    """
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:  # ValueError: not UTF-8 text, or not JSON
        raise UserError(f"{flag} {path}: expected a JSON lines file written by the ladder ({err})") from None
    records = [r for r in records if isinstance(r, dict) and "ladder_id" in r]
    summaries = [r for r in records if r.get("record") == "ladder_summary"]
    if not summaries:
        raise UserError(f'{flag} {path}: no ladder summary records ("record": "ladder_summary") in it')
    last = summaries[-1]["ladder_id"]
    return [r for r in records if r["ladder_id"] == last]


def read_resume(path: Path, cfg: Config) -> list[dict]:
    """The records of the last ladder in ``path`` (:func:`read_ladder`) for ``--resume`` of a ladder
    of ``cfg``: its rungs are reused only if they measured the same config, with the same values of
    every key the rungs do not own (:data:`dlas_compare.ladder_rungs.LADDER_KEYS`).

    Raises:
        UserError: ``path`` cannot be read as a ladder, or its ladder ran another config, or another
            value of one of its keys (the first such key named).
    """
    records = read_ladder(path, "--resume")
    theirs = next(r.get("config") for r in records if r.get("record") == "ladder_summary")
    if theirs != cfg.name:
        raise UserError(
            f"--resume {path}: a ladder of config {theirs!r}, this one is {cfg.name!r}; its rungs measured "
            f"another config (--resume a ladder of {cfg.name!r}, or leave --resume out)"
        )
    mine = {k: v for k, v in config_mod.config_dict(cfg).items() if k not in LADDER_KEYS}
    for r in records:
        values = r.get("config_values")
        if not isinstance(values, dict):
            continue
        for key, value in mine.items():
            if key in values and values[key] != value:
                raise UserError(
                    f"--resume {path}: its ladder ran {cfg.name!r} with {key}={values[key]!r}, this one has "
                    f"{key}={value!r}; its rungs measured other settings (set them alike, or leave --resume out)"
                )
    return records


def read_summaries(path: Path) -> list[dict]:
    """The summary records of the last ladder in ``path`` (:func:`read_ladder`)."""
    return [r for r in read_ladder(path) if r.get("record") == "ladder_summary"]
