"""The ladder of three frameworks on one H200, on CPU with fakes: what it plans to run, measure and
skip (and why), the windows its time budget leaves, how it trims them as rungs take longer than
estimated, --resume, the table, and the figure read back through matplotlib's objects."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from dlas_compare import (
    ladder,
    ladder_figure,
    ladder_rungs,
    ladder_runner,
    ladder_schedule,
    ladder_table,
    ladder_verdicts,
)
from dlas_compare import ladder_budget as budget
from shared_data.core import config as config_mod

H200 = "1 x NVIDIA H200"
ONE_GPU = "1 GPU: data parallel needs several GPUs (--num_devices N runs it on N of any devices)"
#: FULL samples/s the fake benchmark reports per rung (IO and SYNTHETIC derived from it)
FULL = {"baseline": 100.0, "workers": 90.0, "dali": 700.0, "amp": 800.0, "compile": 820.0, "device": 3400.0}


def one_h200_plans(cfg):
    probes = {fw: ladder_rungs.Probe(fw, gpus=1, devices=1, device="NVIDIA H200") for fw in ("jax", "tf", "torch")}
    return {fw: ladder_rungs.plan(fw, found, cfg, cpu_count=16) for fw, found in probes.items()}


class FakeRunner:
    """Runs no process: advances a fake clock by the table's process start and each rung's set-up
    times ``slow`` plus the timed windows its arguments ask for (:func:`budget.window_cost`), and
    returns records like the benchmark's; the rungs in ``crash`` end their process with an error."""

    def __init__(self, slow: float = 1.0, crash=()):
        self.now, self.slow, self.crash, self.calls = 0.0, slow, set(crash), []

    def clock(self) -> float:
        return self.now

    def __call__(self, steps, modes, args, timeout, progress=None):
        value = lambda flag: args[args.index(flag) + 1]
        windows = budget.Windows(
            int(value("--windows")), float(value("--window_sec")), int(value("--min_window_steps"))
        )
        fw = steps[0].framework
        self.calls.append(([s.index for s in steps], fw, windows, round(timeout, 1)))
        start, records = self.now, []
        self.now += self.slow * budget.PROCESS_SEC[fw]
        for step, rung_modes in zip(steps, modes):
            took = self.slow * budget.setup_sec(fw, step.rung.name)
            took += sum(budget.window_cost(step.rung.name, m, windows) for m in rung_modes)
            if self.now + took - start > timeout:
                self.now = start + timeout
                return records, f"timed out after {timeout:.0f} s", "--xla_flags"
            if (fw, step.index) in self.crash:
                return records, "exit 1: RuntimeError: boom", "--xla_flags"
            self.now += took
            full = FULL[step.rung.name] * {"jax": 1.0, "tf": 0.95, "torch": 0.6}[fw]
            rates = {"io": full * 1.1, "synthetic": 3600.0 if step.settings.enable_amp else 1300.0, "full": full}
            records += [
                {"mode": m, "framework": fw, "samples_per_sec": rates[m], "samples_per_sec_min": rates[m] - 5,
                 "samples_per_sec_max": rates[m] + 10, "device": H200, "global_batch": 64,
                 "ladder_step": step.index, "rung_sec": took}
                for m in rung_modes
            ]  # fmt: skip
            if progress is not None:
                progress(list(records))
        return records, None, "--xla_flags"


PROCESSES = [("jax", [1, 2, 3, 4]), ("tf", [1, 2, 3, 4, 5, 6]), ("torch", [1, 2, 3, 4]), ("jax", [5, 6])]


def test_one_h200_schedule_runs_each_framework_in_as_few_processes_as_its_flags_allow(tiny_cfg):
    plans = one_h200_plans(tiny_cfg)
    schedule = ladder_schedule.make_schedule(plans, ladder.MODES, budget.Windows(3, 1.0), 1000.0)
    groups = schedule.groups()
    assert [(g[0].framework, [s.index for s in g]) for g in groups] == PROCESSES
    # JAX reads XLA_FLAGS once per process: the kit's flags come on at compilation, in a second
    # process; TF's and PyTorch's processes start with the caller's flags (the kit adds its own)
    flags = [ladder_rungs.process_xla_flags(g[0]) for g in groups]
    caller = os.environ["XLA_FLAGS"]  # tests/conftest.py's, and the kit's default once jax_impl was imported
    assert flags[1:] == [caller] * 3 and "--xla_force_host_platform_device_count=2" in flags[0]
    assert flags[0].endswith(" --xla_gpu_force_conv_nhwc=false") and "=true" not in flags[0]
    # every framework's first process, then JAX's second; a rung that does not run stays in its place
    order = [(s.framework, s.index) for s in schedule.order]
    assert order == [("jax", i) for i in range(1, 5)] + [("tf", i) for i in range(1, 8)] + [
        ("torch", i) for i in range(1, 8)
    ] + [("jax", 5), ("jax", 6), ("jax", 7)]  # fmt: skip
    skips = {(s.framework, s.index): s.skip for s in schedule.order if s.skip}
    assert skips[("jax", 7)] == skips[("tf", 7)] == ONE_GPU
    assert "no switch" in skips[("torch", 5)] and "torch.compile" in skips[("torch", 5)]
    assert skips[("torch", 6)] == "the reference has no GPU-resident loader (device is JAX's and TF's)"
    assert "torch_ddp" in skips[("torch", 7)] and len(skips) == 5
    modes = [schedule.modes["tf", i] for i in range(1, 7)]
    assert modes == [["io", "synthetic", "full"], ["io", "full"], ["io", "full"]] + [["synthetic", "full"]] * 2 + [
        ["io", "full"]
    ]
    assert budget.modes_of("amp", ladder.MODES, all_modes=True) == ["io", "synthetic", "full"]

    # set-up 398 s by the table: processes JAX 15 + 15, TF 30, PyTorch 15; rungs JAX 29+7+2+36 and
    # 19+3, TF 27+20+3+18+44+3, PyTorch 63+12+2+35
    runs = schedule.runs(groups)
    assert sum(budget.setup_sec(r.framework, r.rung, r.new_process) for r in runs) == 398
    # windows of 3 x 1 s, at least 5 steps: the 12 lowmem input modes last a drain of 2 steps of
    # 0.85 s and 3 windows of 5: 14.45 s; the other 23 modes 3 s, and the drains of their 14 input
    # modes: 2 steps in IO (DALI 0.12 s x3, GPU-resident 0.02 s x2) and in the compiled FULL (0.1 s,
    # 5 x its step: x2), 8 (the cap) in a FULL within 3 x its step (DALI 0.12 s x3, bf16 0.11 s x3,
    # GPU-resident 0.02 s x2)
    drains = 2 * (3 * 0.12 + 2 * 0.02 + 2 * 0.1) + 8 * (3 * 0.12 + 3 * 0.11 + 2 * 0.02)
    assert [budget.drain_steps("dali", m) for m in ("io", "synthetic", "full")] == [2, 0, 8]
    assert budget.total(runs, budget.Windows(3, 1.0)) == pytest.approx(398 + 12 * 14.45 + 23 * 3 + drains)
    assert schedule.windows(1000.0) == (budget.Windows(3, 1.0), True)
    lines = ladder_schedule.schedule_lines(schedule, 1000.0)
    assert lines[0].startswith(
        "schedule: 16 rungs run in 4 processes, 0 taken from --resume, 5 skipped; timed windows 3 x 1 s per "
        "mode (at least 5 steps each); estimated 647 s of the 1000 s left of --budget_sec 1000;"
    )
    assert lines[1] == f"  jax process (rungs 1, 2, 3, 4): XLA_FLAGS='{flags[0]}', ~15 s to start"
    assert "  jax 1. baseline: io synthetic full, ~61 s" in lines  # 29 + 2 x 14.45 + 3
    assert "  tf 5. compilation: synthetic full, ~50 s" in lines  # 44 + 3 + 3 + 0.2
    assert "  torch 2. more workers: io full, ~41 s" in lines  # 12 + 2 x 14.45
    assert f"  tf 7. data parallel: skipped: {ONE_GPU}" in lines
    assert len(lines) == 1 + 4 + 21


def test_the_budget_trims_fast_windows_first_and_never_the_floor(tiny_cfg):
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), 640.0)
    # a slow rung's window is its 5-step floor at any window_sec up to 5 x 0.85 s: trimming leaves it
    slow = [budget.window_cost("baseline", "io", budget.Windows(3, sec)) for sec in (1.0, 0.89, 0.5)]
    assert slow == [pytest.approx(14.45)] * 3  # the drain's 2 x 0.85 s and 3 x 5 x 0.85 s
    assert budget.window_cost("dali", "io", budget.Windows(3, 0.89)) == pytest.approx(0.24 + 2.67)
    assert budget.window_cost("dali", "full", budget.Windows(3, 0.89)) == pytest.approx(0.96 + 2.67)
    assert budget.window_cost("dali", "synthetic", budget.Windows(3, 0.89)) == pytest.approx(2.67)  # no drain
    # 3 windows: 398 + 173.4 (the lowmem floors) + 7.04 (the other drains) + 23 x 3 x s <= 640: s = 0.89
    assert schedule.windows(640.0) == (budget.Windows(3, 0.89), True)
    assert "(windows trimmed from 3 x 1 s)" in ladder_schedule.schedule_lines(schedule, 640.0)[0]
    # 3 windows at the floor's 0.5 s (0.6 s for 5 DALI steps) are 615.2 s; 2 windows: 398 + 12 x 10.2
    # + 7.04 + 23 x 2 x s <= 610 fits s = 1
    assert schedule.windows(610.0) == (budget.Windows(2, 1.0), True)
    assert schedule.windows(570.0) == (budget.Windows(2, 0.92), True)  # s <= 42.56 / 46
    # the floor: 2 windows of 0.5 s, at least 5 steps: 551.9 s, over 551
    assert schedule.windows(551.0) == (budget.Windows(2, 0.5), False)
    head = ladder_schedule.schedule_lines(schedule, 520.0)[0]
    assert head.split("; ")[2].endswith(
        "estimated 552 s of the 520 s left of --budget_sec 640 (over it even at the smallest windows: the "
        "budget stops the last rungs, by the estimate jax 5, jax 6)"
    )


def test_the_recipe_s_budget_plans_every_rung_on_one_h200(tiny_cfg):
    """run.sh gives the ladder the call (--budget_sec 570, its set-up done by setup.sh in a call
    before); the probes take ~12 s of it: the 16 rungs fit in the 558 s left, at 2 windows of 0.66 s
    (at least 5 steps: a lowmem window ~4.3 s), none expected to be stopped; at the floor (2 x 0.5 s)
    they take 552 s."""
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0, 5), 570.0)
    assert schedule.windows(558.0) == (budget.Windows(2, 0.66), True)
    assert budget.total(schedule.runs(schedule.groups()), budget.FLOOR) == pytest.approx(551.94)
    head = ladder_schedule.schedule_lines(schedule, 558.0)[0]
    assert head.startswith("schedule: 16 rungs run in 4 processes, 0 taken from --resume, 5 skipped")
    assert "estimated 558 s of the 558 s left of --budget_sec 570 (windows trimmed from 3 x 1 s)" in head


def test_run_with_the_table_s_times_fits_the_budget(tiny_cfg, tmp_path):
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), 660.0)
    fake = FakeRunner()
    out = tmp_path / "ladder.jsonl"
    summaries = ladder_runner.run_ladder(schedule, [], out, 150.0, "short_opt", runner=fake, clock=fake.clock)
    assert [(fw, idx) for idx, fw, *_ in fake.calls] == [(fw, idx) for fw, idx in PROCESSES]
    assert {w for *_, w, _ in fake.calls} == {budget.Windows(3, 1.0)}  # the table is right: nothing trimmed
    assert fake.now == pytest.approx(647.44)
    statuses = [s["status"] for s in summaries]
    assert statuses.count("ran") == 16 and statuses.count("skipped") == 5
    assert len([json.loads(line) for line in out.read_text().splitlines()]) == 16 + 35 + 5

    jax = {s["ladder_step"]: s for s in summaries if s["framework"] == "jax"}
    assert jax[1]["rung_sec"] == pytest.approx(29 + 2 * 14.45 + 3) and jax[1]["process_rungs"] == [1, 2, 3, 4]
    assert jax[1]["windows"] == {"windows": 3, "window_sec": 1.0, "min_steps": 5} and jax[7]["process_sec"] is None
    assert jax[2]["measured_modes"] == ["io", "full"] and jax[2]["values_from"] == {"io": 2, "synthetic": 1, "full": 2}
    assert jax[2]["synthetic_samples_per_sec"] == 1300.0 and jax[4]["io_samples_per_sec"] == pytest.approx(770.0)
    assert jax[6]["speedup_vs_baseline"] == 34.0 and jax[6]["verdict"] == "compute-bound"
    text = ladder_table.table(summaries)
    assert "jax       2 more workers              99.0   (1300.0)      90.0    0.90    0.90  input-bound" in text
    assert "tf        4 mixed precision        (731.5)     3600.0     760.0    8.00    1.14  input-bound" in text
    assert "torch     5 compilation         skipped: the reference has no switch" in text


def test_a_slower_machine_gets_the_floor_and_loses_the_last_rungs(tiny_cfg, tmp_path):
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), 660.0)
    fake = FakeRunner(slow=1.3)
    summaries = ladder_runner.run_ladder(
        schedule, [], tmp_path / "a.jsonl", 150.0, "short_opt", runner=fake, clock=fake.clock
    )
    assert fake.calls[0][2] == budget.Windows(3, 1.0)  # the table's estimate, before anything ran
    # JAX's first process took 1.3 x its 88 s of set-up and its windows: set-up 1.3 x the table's;
    # the rest gets the floor
    assert {c[2] for c in fake.calls[1:]} == {budget.Windows(2, 0.5)}
    stopped = [(s["framework"], s["ladder_step"], s["status"], s["reason"]) for s in summaries
               if s["status"] != "ran" and not s["reason"].startswith(("1 GPU", "the reference"))]  # fmt: skip
    budget_text = "the ladder's time budget (--budget_sec 660)"
    assert stopped == [("jax", 5, "stopped", f"{budget_text} ran out during it"),
                       ("jax", 6, "skipped", f"{budget_text} was spent")]  # fmt: skip
    assert fake.now == pytest.approx(660.0) and [s["status"] for s in summaries].count("ran") == 14


def test_a_crash_loses_only_its_rung_and_the_rest_run_in_a_new_process(tiny_cfg, tmp_path):
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    fake = FakeRunner(crash={("jax", 2)})
    summaries = ladder_runner.run_ladder(
        schedule, [], tmp_path / "c.jsonl", 150.0, "short_opt", runner=fake, clock=fake.clock
    )
    assert [(fw, idx) for idx, fw, *_ in fake.calls][:2] == [("jax", [1, 2, 3, 4]), ("jax", [3, 4])]
    jax = {s["ladder_step"]: s for s in summaries if s["framework"] == "jax"}
    assert (jax[1]["status"], jax[2]["status"], jax[3]["status"]) == ("ran", "failed", "ran")
    assert jax[2]["reason"] == "exit 1: RuntimeError: boom"
    assert jax[3]["previous_rung"] == "baseline" and jax[3]["speedup_vs_previous"] == 7.0
    # a process that fails at its first rung again is not started once per rung: TF's rungs 1 and 2
    # each fail a process; the rest fail with the second's reason
    fake = FakeRunner(crash={("tf", 1), ("tf", 2)})
    summaries = ladder_runner.run_ladder(
        schedule, [], tmp_path / "d.jsonl", 150.0, "short_opt", runner=fake, clock=fake.clock
    )
    assert [idx for idx, fw, *_ in fake.calls if fw == "tf"] == [[1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6]]
    tf = [(s["status"], s["reason"]) for s in summaries if s["framework"] == "tf"]
    assert tf[:6] == [("failed", "exit 1: RuntimeError: boom")] * 6


def test_resume_runs_only_what_the_first_call_did_not(tiny_cfg, tmp_path):
    plans = one_h200_plans(tiny_cfg)
    first = tmp_path / "first.jsonl"
    fake = FakeRunner(slow=1.3)
    schedule = ladder_schedule.make_schedule(plans, ladder.MODES, budget.Windows(3, 1.0), 660.0)
    ladder_runner.run_ladder(schedule, [], first, 150.0, "short_opt", runner=fake, clock=fake.clock)
    again = ladder_schedule.make_schedule(
        plans, ladder.MODES, budget.Windows(3, 1.0), 660.0, resume=ladder_runner.read_ladder(first)
    )
    assert len(again.reuse) == 14 and ("jax", 5) not in again.reuse
    assert ladder_schedule.schedule_lines(again, 660.0)[0].startswith(
        "schedule: 2 rungs run in 1 processes, 14 taken from --resume, 5 skipped"
    )
    second = FakeRunner()
    out = tmp_path / "second.jsonl"
    summaries = ladder_runner.run_ladder(again, [], out, 150, "short_opt", runner=second, clock=second.clock)
    assert [(fw, idx) for idx, fw, *_ in second.calls] == [("jax", [5, 6])]
    assert [s["status"] for s in summaries].count("ran") == 16
    jax6 = next(s for s in summaries if (s["framework"], s["ladder_step"]) == ("jax", 6))
    assert jax6["speedup_vs_baseline"] == 34.0 and jax6["resumed_from"] is None
    assert next(s for s in summaries if s["framework"] == "tf")["resumed_from"] is not None
    assert len({r["ladder_id"] for r in ladder_runner.read_ladder(out)}) == 1


def test_unreliable_when_full_outruns_io():
    """The H200's PyTorch baseline at 2 windows of 1-2 steps: FULL 255.0 (windows of 18.8 and 491.2)
    above IO 82.4 is noise, not a bottleneck; within 1.1 x IO the rule stands."""
    bound, why = ladder_verdicts.verdict(82.4, 1069.7, 255.0)
    assert bound == "unreliable" and why.startswith("FULL 255.0 > 1.1 x IO 82.4") and "no conclusion" in why
    assert ladder_verdicts.verdict(100.0, 1300.0, 110.0)[0] == "input-bound"
    assert ladder_verdicts.verdict(100.0, 1300.0, 110.2)[0] == "unreliable"
    assert ladder_verdicts.verdict(788.3, 648.4, 179.2)[0] == "compute-bound"


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_without_torch_its_rungs_are_skipped_with_the_reason(tiny_cfg, tmp_path):
    found = ladder_rungs.probe("torch")
    assert found.reason == "torch is not installed"
    plans = {"jax": one_h200_plans(tiny_cfg)["jax"], "torch": ladder_rungs.plan("torch", found, tiny_cfg)}
    schedule = ladder_schedule.make_schedule(plans, ladder.MODES, budget.Windows(2, 1.0), None)
    lines = ladder_schedule.schedule_lines(schedule, None)
    assert lines[0].startswith(
        "schedule: 6 rungs run in 2 processes, 0 taken from --resume, 8 skipped; timed windows 2 x 1 s"
    )
    assert "  torch 1. baseline: skipped: torch is not installed" in lines
    fake = FakeRunner()
    summaries = ladder_runner.run_ladder(
        schedule, [], tmp_path / "l.jsonl", 150, "short_opt", runner=fake, clock=fake.clock
    )
    assert {fw for _, fw, *_ in fake.calls} == {"jax"}
    assert "torch     (every rung)          skipped: torch is not installed" in ladder_table.table(summaries)


def test_main_with_fake_probes_and_benchmarks(tiny_cfg, tmp_path, monkeypatch, capsys):
    """The command itself: the schedule printed before the first rung, the JSON lines, the figure."""
    monkeypatch.setattr(ladder, "probe", lambda fw: ladder_rungs.Probe(fw, gpus=1, devices=1, device="NVIDIA H200"))
    fake = FakeRunner()
    monkeypatch.setattr(ladder_runner, "run_group", fake)
    out = tmp_path / "ladder.jsonl"
    args = ["--config", "cpu_tiny", "--set", f"train_path={tiny_cfg.train_path}", "--out", str(out)]
    assert ladder.main(args + ["--window_sec", "0.5", "--windows", "2", "--budget_sec", "3600"]) == 0
    printed = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(printed) if line.startswith("[ladder] schedule: 16 rungs run"))
    assert printed[head + 2] == "[ladder]   jax 1. baseline: io synthetic full, ~50 s"  # 29 + 2 x 10.2 + 1
    assert head < next(i for i, line in enumerate(printed) if line.startswith("[ladder] jax 1. baseline: the tutorial"))
    assert {w for *_, w, _ in fake.calls} == {budget.Windows(2, 0.5)}
    assert (tmp_path / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fake.calls[0][:2] == ([1, 2, 3, 4], "jax")


def _summaries(cfg, tmp_path):
    schedule = ladder_schedule.make_schedule(one_h200_plans(cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    fake = FakeRunner()
    return ladder_runner.run_ladder(schedule, [], tmp_path / "l.jsonl", 150, "short_opt", runner=fake, clock=fake.clock)


def test_figure_groups_bars_per_rung_beside_the_tutorial_s_a100(tiny_cfg, tmp_path):
    summaries = _summaries(tiny_cfg, tmp_path)
    rungs = [(r.name, r.title) for r in ladder_rungs.RUNGS]
    fig = ladder_figure.ladder_axes(summaries, rungs, ladder_figure.figure_title(summaries, "short_opt"))
    (ax,) = fig.axes
    assert ax.get_title() == (
        "The tutorial's ladder on 1 x NVIDIA H200, config short_opt, batch 64: FULL samples/s per rung"
    )
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 3400
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"{i}. {r.title}" for i, r in enumerate(ladder_rungs.RUNGS, 1)
    ]
    assert ax.get_ylabel() == "FULL samples/s (median window; whiskers: min-max)"
    bars = {c.get_label(): c for c in ax.containers if type(c).__name__ == "BarContainer"}
    assert list(bars) == ["jax", "tf", "torch", ladder_figure.TUTORIAL_LABEL]
    assert [len(bars[fw]) for fw in ("jax", "tf", "torch")] == [6, 6, 4]
    assert [p.get_height() for p in bars["jax"]] == [FULL[r] for r in FULL]
    assert [p.get_height() for p in bars[ladder_figure.TUTORIAL_LABEL]] == [86.5, 274.0, 395.0, 513.0, 542.0]
    colours = {fw: bars[fw].patches[0].get_facecolor() for fw in bars}
    assert len(set(colours.values())) == 4  # one colour per framework, grey for the tutorial
    # five groups hold the reference, the bars of a group sit side by side within it
    jax_x = [p.get_x() + p.get_width() / 2 for p in bars["jax"]]
    ref_x = [p.get_x() + p.get_width() / 2 for p in bars[ladder_figure.TUTORIAL_LABEL]]
    assert jax_x[0] == pytest.approx(-0.3) and ref_x[0] == pytest.approx(0.3) and ref_x[4] == pytest.approx(4.3)
    whiskers = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    segments = [c.lines[2][0].get_segments()[0] for c in whiskers[:6]]  # jax: its slowest to its fastest window
    assert [(s[0][1], s[1][1]) for s in segments] == [(v - 5, v + 10) for v in FULL.values()]
    assert len(whiskers) == 6 + 6 + 4  # one per bar
    assert [t.get_text() for t in ax.texts].count("skipped") == 5
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(bars)
    fig.clf()


def test_the_recorded_jax_ladder_replots(tmp_path):
    """The H200 JAX ladder recorded before the rungs measured only what they change (every mode at
    every rung, no ``values_from``) gives its table and the new figure."""
    from shared_data.core.config import REPO_ROOT

    recorded = REPO_ROOT / "experiments/ladder_h200/results/ladder_jax_short_opt.jsonl"
    summaries = ladder_runner.read_summaries(recorded)
    text = ladder_table.table(summaries)
    assert "jax       4 mixed precision          762.6     2325.8     802.9    7.46    1.13  input-bound" in text
    assert ladder_table.noise_lines(summaries)[0].startswith("jax: SYNTHETIC of rungs 1, 2, 3")
    rungs = [(r.name, r.title) for r in ladder_rungs.RUNGS]
    fig = ladder_figure.ladder_axes(summaries, rungs, ladder_figure.figure_title(summaries, "short_opt"))
    bars = {c.get_label(): c for c in fig.axes[0].containers if type(c).__name__ == "BarContainer"}
    assert [round(p.get_height(), 1) for p in bars["jax"]] == [107.7, 85.9, 708.2, 802.9]
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text() in ("failed", "skipped")] == [
        "failed",
        "skipped",
        "skipped",
    ]
    fig.clf()


def test_a_framework_that_runs_nowhere_keeps_its_place_in_the_order(tiny_cfg):
    plans = one_h200_plans(tiny_cfg)
    plans["torch"] = ladder_rungs.plan("torch", ladder_rungs.Probe("torch", reason="torch is not installed"), tiny_cfg)
    schedule = ladder_schedule.make_schedule(plans, ladder.MODES, budget.Windows(3, 1.0), None)
    order = [(s.framework, s.index) for s in schedule.order]
    assert order == [("jax", i) for i in range(1, 5)] + [(fw, i) for fw in ("tf", "torch") for i in range(1, 8)] + [
        ("jax", i) for i in range(5, 8)
    ]


def test_each_rung_is_written_as_it_finishes_so_a_failure_loses_at_most_that_rung(tiny_cfg, tmp_path):
    """JAX's first process runs rungs 1-4; the ladder stops (an exception out of the runner, as a
    kill of the ladder would) during rung 3: rungs 1 and 2 are in the file with their summaries, each
    written while the process was still running."""
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    out, seen = tmp_path / "l.jsonl", []
    fake = FakeRunner()

    def stopped(steps, modes, args, timeout, progress=None):
        def watch(records):
            lines = out.read_text().splitlines() if out.exists() else []
            seen.append([r["ladder_step"] for r in map(json.loads, lines) if "record" in r])
            if len({r["ladder_step"] for r in records}) == 2:
                raise KeyboardInterrupt
            progress(records)

        return fake(steps, modes, args, timeout, watch)

    with pytest.raises(KeyboardInterrupt):
        ladder_runner.run_ladder(schedule, [], out, 150, "short_opt", runner=stopped, clock=fake.clock)
    assert seen == [[], [1]]  # rung 1's summary was written before rung 2 ended
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["ladder_step"], r["status"]) for r in kept if "record" in r] == [(1, "ran")]
    assert {r["mode"] for r in kept if r.get("ladder_step") == 1 and "mode" in r} == {"io", "synthetic", "full"}


def test_a_write_failure_of_out_is_one_line_naming_it(tiny_cfg):
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    fake = FakeRunner()
    written = r"^--out /dev/full: cannot write the ladder's records \(No space.*; no rung is in it$"
    with pytest.raises(ladder.UserError, match=written):
        ladder_runner.run_ladder(
            schedule, [], ladder.Path("/dev/full"), 150, "short_opt", runner=fake, clock=fake.clock
        )


def _never(*_):
    raise AssertionError("probed or measured before its arguments were checked")


def _tiny_args(cfg):
    return ["--frameworks", "jax", "--config", "cpu_tiny", "--set", f"train_path={cfg.train_path}"]


def test_out_and_resume_are_checked_before_anything_runs(tiny_cfg, tmp_path, monkeypatch):
    """--out a folder; --resume of a binary file, of another config's ladder, of a ladder with another
    value of a config key: one error each, before the probes."""
    monkeypatch.setattr(ladder, "probe", _never)
    args = _tiny_args(tiny_cfg)
    with pytest.raises(ladder.UserError, match="is a folder, expected a file path"):
        ladder.main([*args, "--out", str(tmp_path)])
    binary = tmp_path / "weights.npz"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ladder.UserError, match=f"^--resume {binary}: expected a JSON lines file written by the ladder"):
        ladder.main([*args, "--resume", str(binary), "--out", str(tmp_path / "a.jsonl")])
    schedule = ladder_schedule.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    fake, other = FakeRunner(), tmp_path / "other.jsonl"
    ladder_runner.run_ladder(schedule, [], other, 150, "cpu_default", runner=fake, clock=fake.clock)
    with pytest.raises(ladder.UserError, match="a ladder of config 'cpu_default', this one is 'cpu_tiny'"):
        ladder.main([*args, "--resume", str(other), "--out", str(tmp_path / "b.jsonl")])
    same, records = tmp_path / "same.jsonl", [json.loads(line) for line in other.read_text().splitlines()]
    mine = config_mod.load_config("cpu_tiny", overrides={"train_path": tiny_cfg.train_path})
    values = {**config_mod.config_dict(mine), "Nsamples": 999, "enable_amp": True}  # a rung owns enable_amp
    records = [{**r, "config": "cpu_tiny"} if "record" in r else {**r, "config_values": values} for r in records]
    same.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ladder.UserError, match=r"ran 'cpu_tiny' with Nsamples=999, this one has Nsamples="):
        ladder.main([*args, "--resume", str(same), "--out", str(tmp_path / "c.jsonl")])


def test_full_above_synthetic_is_unreliable():
    """The CPU ladder's TF rung: FULL 40.4 over SYNTHETIC 30.0, IO far above both."""
    bound, why = ladder_verdicts.verdict(350.0, 30.0, 40.4)
    assert bound == "unreliable" and why.startswith("FULL 40.4 > 1.1 x SYNTHETIC 30.0")
    assert ladder_verdicts.verdict(None, 30.0, 40.4)[0] == "unreliable"
    assert ladder_verdicts.verdict(350.0, 30.0, 32.9)[0] == "compute-bound"  # within the 10% noise band


def test_a_ladder_of_another_size_is_drawn_against_its_own_baseline(tiny_cfg, tmp_path):
    """A CPU ladder (batch 8, 32^3 crops; JAX and TF name the CPU differently): FULL over each
    framework's baseline, no A100 bars, the device named once, an unreliable rung cross-hatched."""
    summaries = _summaries(tiny_cfg, tmp_path)
    for s in summaries:
        s.update(global_batch=8, crop_size=32, device="1 x cpu" if s["framework"] == "jax" else "1 x CPU")
    tf_dali = next(s for s in summaries if (s["framework"], s["ladder_rung"]) == ("tf", "dali"))
    tf_dali["verdict"] = "unreliable"
    rungs = [(r.name, r.title) for r in ladder_rungs.RUNGS]
    fig = ladder_figure.ladder_axes(summaries, rungs, ladder_figure.figure_title(summaries, "cpu_default"))
    (ax,) = fig.axes
    assert ax.get_title().replace("\n", " ") == (  # wrapped to the figure's width
        "The tutorial's ladder on 1 x CPU, config cpu_default, batch 8, 32^3 crops: FULL per rung relative to "
        "each framework's baseline; cross-hatched: unreliable"
    )
    assert max(len(line) for line in ax.get_title().split("\n")) <= 110
    bars = {c.get_label(): c for c in ax.containers if type(c).__name__ == "BarContainer"}
    assert list(bars) == ["jax", "tf", "torch"]  # no tutorial bars
    assert [p.get_height() for p in bars["jax"]] == pytest.approx([FULL[r] / FULL["baseline"] for r in FULL])
    assert [p.get_hatch() for p in bars["tf"]] == [None, None, "xx", None, None, None]
    assert "7.00x?" in [t.get_text() for t in ax.texts]
    assert ax.get_ylabel() == "FULL / own baseline's (median; whiskers: min-max)"
    fig.clf()
