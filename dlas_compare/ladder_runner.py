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
from dlas_compare.ladder_rungs import Step, benchmark_args, process_xla_flags
from dlas_compare.ladder_schedule import Schedule
from dlas_compare.ladder_verdicts import summarize
from shared_data.core.errors import UserError
from shared_data.runtime.cli import benchmark_command


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
