"""The ladder of three frameworks on one H200, on CPU with fakes: what it plans to run, measure and
skip (and why), the windows its time budget leaves, how it trims them as rungs take longer than
estimated, --resume, the table, and the figure read back through matplotlib's objects."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dlas_compare import ladder, ladder_figure
from dlas_compare import ladder_budget as budget

H200 = "1 x NVIDIA H200"
ONE_GPU = "1 GPU: data parallel needs several GPUs (--num_devices N runs it on N of any devices)"
#: FULL samples/s the fake benchmark reports per rung (IO and SYNTHETIC derived from it)
FULL = {"baseline": 100.0, "workers": 90.0, "dali": 700.0, "amp": 800.0, "compile": 820.0, "device": 3400.0}


def one_h200_plans(cfg):
    probes = {fw: ladder.Probe(fw, gpus=1, devices=1, device="NVIDIA H200") for fw in ("jax", "tf", "torch")}
    return {fw: ladder.plan(fw, found, cfg, cpu_count=16) for fw, found in probes.items()}


class FakeBench:
    """Runs no process: advances a fake clock by the table's set-up seconds times ``slow`` plus the
    timed windows its arguments ask for, and returns records like the benchmark's."""

    def __init__(self, slow: float = 1.0):
        self.now, self.slow, self.calls = 0.0, slow, []

    def clock(self) -> float:
        return self.now

    def __call__(self, step, modes, args, timeout):
        windows, window_sec = int(args[args.index("--windows") + 1]), float(args[args.index("--window_sec") + 1])
        self.calls.append((step.framework, step.index, list(modes), windows, window_sec, round(timeout, 1)))
        took = self.slow * budget.setup_sec(step.framework, step.rung.name) + len(modes) * windows * window_sec
        if took > timeout:
            self.now += timeout
            return [], f"timed out after {timeout:.0f} s", "--xla_flags"
        self.now += took
        full = FULL[step.rung.name] * {"jax": 1.0, "tf": 0.95, "torch": 0.6}[step.framework]
        rates = {"io": full * 1.1, "synthetic": 3600.0 if step.settings.enable_amp else 1300.0, "full": full}
        records = [
            {"mode": m, "framework": step.framework, "samples_per_sec": rates[m], "samples_per_sec_min": rates[m] - 5,
             "samples_per_sec_max": rates[m] + 10, "device": H200, "global_batch": 64}
            for m in modes
        ]  # fmt: skip
        return records, None, "--xla_flags"


def test_one_h200_schedule_says_what_runs_measures_and_skips(tiny_cfg):
    plans = one_h200_plans(tiny_cfg)
    schedule = ladder.make_schedule(plans, ladder.MODES, budget.Windows(3, 1.0), 1000.0)
    order = [(s.framework, s.index) for s in schedule.order]
    assert order[:4] == [("jax", 1), ("tf", 1), ("torch", 1), ("jax", 2)] and len(order) == 21
    run = [(s.framework, s.index) for s in schedule.order if schedule.to_run(s)]
    assert run == [(fw, i) for i in range(1, 7) for fw in ("jax", "tf", "torch") if fw != "torch" or i <= 4]
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

    # set-up 859 s by the table (JAX 239, TF 285, PyTorch 335), 35 timed modes: 1000 s leaves 3 windows
    # of 1 s each (as asked)
    assert sum(budget.setup_sec(fw, rung) for fw, rung, _ in schedule.runs()) == 859
    assert sum(n for *_, n in schedule.runs()) == 35
    assert schedule.windows(1000.0) == (budget.Windows(3, 1.0), True)
    lines = ladder.schedule_lines(schedule, 1000.0)
    assert lines[0].startswith(
        "schedule: 16 rungs run, 0 taken from --resume, 5 skipped; timed windows 3 x 1 s per mode; "
        "estimated 964 s of the 1000 s left of --budget_sec 1000;"
    )
    assert "  jax 1. baseline: io synthetic full, ~64 s" in lines
    assert "  tf 5. compilation: synthetic full, ~66 s" in lines
    assert "  torch 2. more workers: io full, ~106 s" in lines
    assert f"  tf 7. data parallel: skipped: {ONE_GPU}" in lines
    assert len(lines) == 22


def test_the_budget_trims_windows_not_rungs(tiny_cfg):
    schedule = ladder.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 2.0), 960.0)
    # (960 - 859) / 35 = 2.89 s per mode: 3 windows of 0.96 s (rounded down)
    assert schedule.windows(960.0) == (budget.Windows(3, 0.96), True)
    assert "(windows trimmed from 3 x 2 s)" in ladder.schedule_lines(schedule, 960.0)[0]
    # 2.14 s per mode: three windows of 0.71 s; 1.46 s per mode: two windows of 0.72 s keep the min-max
    assert schedule.windows(934.0) == (budget.Windows(3, 0.71), True)
    assert schedule.windows(910.0) == (budget.Windows(2, 0.72), True)
    # the 8.5 minutes of the one-call recipe: the table's set-up alone is over it
    assert schedule.windows(510.0) == (budget.FLOOR, False)
    assert "over it even at the smallest windows" in ladder.schedule_lines(schedule, 510.0)[0]


def test_run_with_the_table_s_times_fits_the_budget(tiny_cfg, tmp_path, capsys):
    schedule = ladder.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 2.0), 960.0)
    fake = FakeBench()
    out = tmp_path / "ladder.jsonl"
    summaries = ladder.run_ladder(schedule, [], out, 150.0, "short_opt", runner=fake, clock=fake.clock)
    assert [(fw, i) for fw, i, *_ in fake.calls] == [(s.framework, s.index) for s in schedule.order if s.skip is None]
    # the table is right: the windows fitted before each rung stay as they were (to the rounding)
    assert {(w, sec) for *_, w, sec, _ in fake.calls} == {(3, 0.96), (3, 0.97)}
    assert 955 < fake.now <= 960
    statuses = [s["status"] for s in summaries]
    assert statuses.count("ran") == 16 and statuses.count("skipped") == 5
    assert len([json.loads(line) for line in out.read_text().splitlines()]) == 16 + 35 + 5

    assert summaries[0]["process_sec"] == pytest.approx(55 + 3 * 3 * 0.96)  # set-up + 3 modes x 3 windows
    assert summaries[0]["windows"] == {"windows": 3, "window_sec": 0.96} and summaries[-1]["process_sec"] is None
    jax = {s["ladder_step"]: s for s in summaries if s["framework"] == "jax"}
    assert jax[2]["measured_modes"] == ["io", "full"] and jax[2]["values_from"] == {"io": 2, "synthetic": 1, "full": 2}
    assert jax[2]["synthetic_samples_per_sec"] == 1300.0 and jax[4]["io_samples_per_sec"] == pytest.approx(770.0)
    assert jax[6]["speedup_vs_baseline"] == 34.0 and jax[6]["verdict"] == "compute-bound"
    text = ladder.table(summaries)
    assert "jax       2 more workers              99.0   (1300.0)      90.0    0.90    0.90  input-bound" in text
    assert "tf        4 mixed precision        (731.5)     3600.0     760.0    8.00    1.14  input-bound" in text
    assert "torch     5 compilation         skipped: the reference has no switch" in text


def test_a_slower_machine_gets_shorter_windows_and_a_much_slower_one_loses_the_last_rungs(tiny_cfg, tmp_path):
    schedule = ladder.make_schedule(one_h200_plans(tiny_cfg), ladder.MODES, budget.Windows(3, 2.0), 960.0)
    fake = FakeBench(slow=1.05)
    summaries = ladder.run_ladder(schedule, [], tmp_path / "a.jsonl", 150.0, "short_opt", runner=fake, clock=fake.clock)
    assert fake.calls[0][3:5] == (3, 0.96)  # the table's estimate, before anything ran
    assert {c[3:5] for c in fake.calls[1:]} == {(3, 0.51), (3, 0.52)}  # 5% slower set-up: (894 - 844) / 32 s a mode
    assert [s["status"] for s in summaries].count("ran") == 16 and fake.now <= 960

    fake = FakeBench(slow=1.3)
    summaries = ladder.run_ladder(schedule, [], tmp_path / "b.jsonl", 150.0, "short_opt", runner=fake, clock=fake.clock)
    assert {c[3:5] for c in fake.calls[1:]} == {(2, 0.5)}  # the floor: two windows of half a second
    stopped = [(s["framework"], s["ladder_step"], s["reason"]) for s in summaries if s["status"] != "ran" and
               not s["reason"].startswith(("1 GPU", "the reference"))]  # fmt: skip
    spent = "the ladder's time budget (--budget_sec 960) was spent"
    assert stopped == [("jax", 5, "the ladder's time budget (--budget_sec 960) ran out during it"), ("tf", 5, spent),
                       ("jax", 6, spent), ("tf", 6, spent)]  # fmt: skip
    assert fake.now == pytest.approx(960.0) and summaries[12]["status"] == "stopped"


def test_resume_runs_only_what_the_first_call_did_not(tiny_cfg, tmp_path):
    plans = one_h200_plans(tiny_cfg)
    first = tmp_path / "first.jsonl"
    fake = FakeBench(slow=1.3)
    schedule = ladder.make_schedule(plans, ladder.MODES, budget.Windows(3, 2.0), 960.0)
    ladder.run_ladder(schedule, [], first, 150.0, "short_opt", runner=fake, clock=fake.clock)
    again = ladder.make_schedule(plans, ladder.MODES, budget.Windows(3, 2.0), 960.0, resume=ladder.read_ladder(first))
    assert sorted(again.reuse) == [(fw, i) for fw in ("jax", "tf", "torch") for i in range(1, 5)]
    assert ladder.schedule_lines(again, 960.0)[0].startswith("schedule: 4 rungs run, 12 taken from --resume, 5 skipped")
    second = FakeBench()
    out = tmp_path / "second.jsonl"
    summaries = ladder.run_ladder(again, [], out, 150, "short_opt", runner=second, clock=second.clock)
    assert [(fw, i) for fw, i, *_ in second.calls] == [("jax", 5), ("tf", 5), ("jax", 6), ("tf", 6)]
    assert [s["status"] for s in summaries].count("ran") == 16
    jax6 = next(s for s in summaries if (s["framework"], s["ladder_step"]) == ("jax", 6))
    assert jax6["speedup_vs_baseline"] == 34.0 and jax6["resumed_from"] is None
    assert next(s for s in summaries if s["framework"] == "tf")["resumed_from"] is not None
    assert len({r["ladder_id"] for r in ladder.read_ladder(out)}) == 1


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_without_torch_its_rungs_are_skipped_with_the_reason(tiny_cfg, tmp_path):
    found = ladder.probe("torch")
    assert found.reason == "torch is not installed"
    plans = {"jax": one_h200_plans(tiny_cfg)["jax"], "torch": ladder.plan("torch", found, tiny_cfg)}
    schedule = ladder.make_schedule(plans, ladder.MODES, budget.Windows(2, 1.0), None)
    lines = ladder.schedule_lines(schedule, None)
    assert lines[0].startswith("schedule: 6 rungs run, 0 taken from --resume, 8 skipped; timed windows 2 x 1 s")
    assert "  torch 1. baseline: skipped: torch is not installed" in lines
    fake = FakeBench()
    summaries = ladder.run_ladder(schedule, [], tmp_path / "l.jsonl", 150, "short_opt", runner=fake, clock=fake.clock)
    assert {fw for fw, *_ in fake.calls} == {"jax"}
    assert "torch     (every rung)          skipped: torch is not installed" in ladder.table(summaries)


def test_main_with_fake_probes_and_benchmarks(tiny_cfg, tmp_path, monkeypatch, capsys):
    """The command itself: the schedule printed before the first rung, the JSON lines, the figure."""
    monkeypatch.setattr(ladder, "probe", lambda fw: ladder.Probe(fw, gpus=1, devices=1, device="NVIDIA H200"))
    fake = FakeBench()
    monkeypatch.setattr(ladder, "run_step", fake)
    out = tmp_path / "ladder.jsonl"
    args = ["--config", "cpu_tiny", "--set", f"train_path={tiny_cfg.train_path}", "--out", str(out)]
    assert ladder.main(args + ["--window_sec", "0.5", "--windows", "2", "--budget_sec", "3600"]) == 0
    printed = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(printed) if line.startswith("[ladder] schedule: 16 rungs run"))
    assert printed[head + 1] == "[ladder]   jax 1. baseline: io synthetic full, ~58 s"
    assert head < next(i for i, line in enumerate(printed) if line.startswith("[ladder] jax 1. baseline: the tutorial"))
    assert {(w, sec) for *_, w, sec, _ in fake.calls} == {(2, 0.5)}
    assert (tmp_path / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fake.calls[0][:3] == ("jax", 1, ["io", "synthetic", "full"])


def _summaries(cfg, tmp_path):
    schedule = ladder.make_schedule(one_h200_plans(cfg), ladder.MODES, budget.Windows(3, 1.0), None)
    fake = FakeBench()
    return ladder.run_ladder(schedule, [], tmp_path / "l.jsonl", 150, "short_opt", runner=fake, clock=fake.clock)


def test_figure_groups_bars_per_rung_beside_the_tutorial_s_a100(tiny_cfg, tmp_path):
    summaries = _summaries(tiny_cfg, tmp_path)
    rungs = [(r.name, r.title) for r in ladder.RUNGS]
    fig = ladder_figure.ladder_axes(summaries, rungs, ladder_figure.figure_title(summaries, "short_opt"))
    (ax,) = fig.axes
    assert ax.get_title() == (
        "The tutorial's ladder on 1 x NVIDIA H200, config short_opt, batch 64: FULL samples/s per rung"
    )
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 3400
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{i}. {r.title}" for i, r in enumerate(ladder.RUNGS, 1)]
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
    summaries = ladder.read_summaries(recorded)
    text = ladder.table(summaries)
    assert "jax       4 mixed precision          762.6     2325.8     802.9    7.46    1.13  input-bound" in text
    assert ladder.noise_lines(summaries)[0].startswith("jax: SYNTHETIC of rungs 1, 2, 3")
    rungs = [(r.name, r.title) for r in ladder.RUNGS]
    fig = ladder_figure.ladder_axes(summaries, rungs, ladder_figure.figure_title(summaries, "short_opt"))
    bars = {c.get_label(): c for c in fig.axes[0].containers if type(c).__name__ == "BarContainer"}
    assert [round(p.get_height(), 1) for p in bars["jax"]] == [107.7, 85.9, 708.2, 802.9]
    assert [t.get_text() for t in fig.axes[0].texts if t.get_text() in ("failed", "skipped")] == [
        "failed",
        "skipped",
        "skipped",
    ]
    fig.clf()
