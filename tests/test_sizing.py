"""A command started on a config sized for a GPU, on a host without one, says so up front with the
time a step takes here at the least and the config to use instead; the benchmark's timed windows say
where they are while a slow step runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_data.core import config as config_mod
from shared_data.runtime import sizing


def test_a_gpu_config_on_a_cpu_gets_its_step_time_and_the_cpu_config(monkeypatch):
    monkeypatch.setattr(sizing, "host_gflops", lambda: 100.0)
    cfg = config_mod.load_config("short_opt")
    # hand count: the six-level U-Net's 81.537 GFLOP per 64^3 sample (forward + backward) x 64 crops
    flop = 81.53726976e9 * 64
    assert sizing.step_seconds_at_least(cfg, 100.0) == pytest.approx(flop / 100e9)
    text = sizing.oversized_warning(cfg, 55, "the benchmark", gpu=False)
    assert text == (
        "config 'short_opt' is sized for a GPU (5.22 TFLOP per step of 64 64^3 crops) and no GPU is visible: "
        "on this CPU (100 GFLOP/s float32 matmul) a step takes at least 52 s, the benchmark (55 steps) at least "
        "48 min. On a CPU use --config cpu_default (or cpu_tiny); Ctrl-C stops"
    )
    assert sizing.oversized_warning(cfg, 55, "the benchmark", gpu=True) is None


def test_a_time_to_quality_budget_bounds_the_training_time_said(monkeypatch):
    """``quality_nonlinear`` (28 epochs of 1024 steps, a 600 s budget): at 100 GFLOP/s a step takes
    52.18 s, so the first epoch already runs past the budget and the run ends after it: 1024 steps,
    14.8 h, not 28672 steps; without the time-to-quality mode the budget does not count."""
    monkeypatch.setattr(sizing, "host_gflops", lambda: 100.0)
    cfg = config_mod.load_config("quality_nonlinear")
    text = sizing.oversized_warning(cfg, 28 * 1024, "training", gpu=False, epoch_steps=1024)
    assert (
        "a step takes at least 52 s, training (28672 steps; its quality budget of 600 s ends it at the first "
        "epoch end past it, after 1024) at least 14.8 h." in text
    )
    off = config_mod.load_config("quality_nonlinear", overrides={"quality_every_epochs": 0})
    text = sizing.oversized_warning(off, 28 * 1024, "training", gpu=False, epoch_steps=1024)
    assert "training (28672 steps) at least 415.6 h." in text


def test_a_cpu_config_is_not_measured(monkeypatch):
    def never():
        raise AssertionError("host_gflops measured for a config that fits any host")

    monkeypatch.setattr(sizing, "host_gflops", never)
    assert sizing.oversized_warning(config_mod.load_config("cpu_default"), 48, "training", gpu=False) is None


def test_host_gflops_is_a_rate():
    assert 0.1 < sizing.host_gflops(seconds=0.02, side=64) < 1e5


def test_the_timed_windows_report_where_they_are(monkeypatch):
    from dlas_compare import benchmark_timing

    monkeypatch.setattr(benchmark_timing, "REPORT_SEC", 0.0)
    said = []
    warm, per_call, counts = benchmark_timing.timed_windows(lambda: None, lambda _: None, 2, 3, 2, report=said.append)
    assert counts == [3, 3]
    assert said == [
        "warm-up step 1/2",
        "warm-up step 2/2",
        *[f"window {w}/2, step {n}/3" for w in (1, 2) for n in (1, 2, 3)],
    ]


def test_the_timed_windows_say_they_wait_for_a_slow_step(monkeypatch):
    """A sync that waits for dispatched steps (a GPU-sized step on a CPU: minutes) is reported every
    WAIT_REPORT_SEC seconds while it waits, in the warm-up and in each window."""
    import time

    from dlas_compare import benchmark_timing

    monkeypatch.setattr(benchmark_timing, "WAIT_REPORT_SEC", 0.1)
    said = []
    benchmark_timing.timed_windows(lambda: None, lambda _: time.sleep(0.35), 2, 3, 1, report=said.append)
    waits = [line.split(",")[0] for line in said if "waiting" in line]
    warm, window = "warm-up: waiting for its 2 step(s)", "window 1/1: waiting for its 3 step(s)"
    n = waits.count(warm)  # about 3 of each; fewer where a busy machine delays the reporting thread
    assert 0 < n < len(waits) and waits == [warm] * n + [window] * (len(waits) - n), said
    assert said[0].endswith(", 0 s so far")
    assert benchmark_timing.timed_windows(lambda: None, lambda _: time.sleep(0.25), 0, 1, 1)[2] == [
        1
    ]  # no report: silent


def test_the_breakdown_says_it_waits_for_a_slow_step(monkeypatch, capsys):
    """step_breakdown's warm-up and timed steps are reported every WAIT_REPORT_SEC seconds while
    their sync waits (a GPU-sized step on a CPU: minutes of silence otherwise)."""
    import time

    from dlas_compare import benchmark_timing, step_breakdown

    class Stop(Exception):
        pass

    class SlowBench:
        syncs = 0

        def step(self):
            pass

        def sync(self):
            time.sleep(0.35)
            self.syncs += 1
            if self.syncs == 2:  # after the timed steps: the trace is not this test's
                raise Stop

    monkeypatch.setattr(benchmark_timing, "WAIT_REPORT_SEC", 0.1)
    with pytest.raises(Stop):
        step_breakdown.trace_bench(SlowBench(), 4, 2, Path("unused"))
    said = [line.split(",")[0] for line in capsys.readouterr().err.splitlines() if "so far" in line]
    warm, timed = "[breakdown] warm-up: waiting for its 2 step(s)", "[breakdown] timed steps: waiting for its 4 step(s)"
    n = said.count(warm)  # about 3 of each; fewer where a busy machine delays the reporting thread
    assert 0 < n < len(said) and said == [warm] * n + [timed] * (len(said) - n), said


def test_the_pytorch_reference_without_torch_is_one_line_and_no_size_warning(monkeypatch):
    """``--framework torch`` where torch is not installed: its one error line, not first the warning
    that the GPU config would take hours here."""
    import importlib.util

    from conftest import assert_one_error_line, run_in_process

    from dlas_compare import benchmark

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed")
    monkeypatch.setattr(sizing, "gpu_visible", lambda: False)
    monkeypatch.setattr(sizing, "host_gflops", lambda: 100.0)
    res = run_in_process(benchmark.main, ["--framework", "torch", "--mode", "synthetic", "--config", "short_opt"])
    assert_one_error_line(res, "the PyTorch reference needs torch")
    assert "sized for a GPU" not in res.stderr


def test_the_trainer_warns_before_it_starts(tmp_path, monkeypatch, caplog):
    from conftest import assert_one_error_line, run_in_process

    from jax_impl import train

    monkeypatch.setattr(sizing, "gpu_visible", lambda: False)
    monkeypatch.setattr(sizing, "host_gflops", lambda: 100.0)
    monkeypatch.chdir(tmp_path)
    res = run_in_process(train.main, ["--config", "short_opt", "--set", "data_loader_config=lowmem"])
    assert_one_error_line(res, "data/train_256.h5")  # no data here: the warning came first
    assert "config 'short_opt' is sized for a GPU" in caplog.text
    assert "training (32 steps) at least 28 min" in caplog.text  # 512 crops / 64 x 4 epochs, 52.2 s each


def test_the_ladder_warns_before_it_asks_for_data(tmp_path, monkeypatch):
    from conftest import assert_one_error_line, run_in_process

    from dlas_compare import ladder

    monkeypatch.setattr(sizing, "gpu_visible", lambda: False)
    monkeypatch.setattr(sizing, "host_gflops", lambda: 100.0)
    monkeypatch.chdir(tmp_path)
    res = run_in_process(ladder.main, ["--config", "short_opt", "--frameworks", "jax"])
    assert_one_error_line(res, "data/train_256.h5")  # no data here: the warning came first
    warning = [line for line in res.stderr.splitlines() if line.startswith("[ladder] warning:")]
    assert len(warning) == 1 and "config 'short_opt' is sized for a GPU" in warning[0]
    # 2 warm-up + 3 windows x 10 steps = 32 steps of 5.22 TFLOP at 100 GFLOP/s: 52.2 s each, 28 min in all
    assert "the first rung of each framework (32 steps) at least 28 min" in warning[0]


def test_the_table_says_which_steps_were_compiled_elsewhere():
    from dlas_compare import benchmark

    base = dict(
        label="jax cpu_tiny", loader="lowmem", precision="float32", global_batch=4, samples_per_sec=10.0,
        step_ms_p50=400.0, step_ms_p90=410.0, mfu=None, peak_memory_gib=None,
    )  # fmt: skip
    records = [
        {**base, "mode": "synthetic", "compile_sec": 12.34, "reused": []},
        {**base, "mode": "io", "compile_sec": 0.0, "reused": []},
        {**base, "mode": "full", "compile_sec": 0.0, "reused": ["train step", "input pipeline"]},
    ]
    lines = benchmark.table(records).splitlines()[2:]
    assert [line.split()[-2] for line in lines] == ["12.3", "-", "reused"]
