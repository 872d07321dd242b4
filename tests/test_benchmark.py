"""Benchmark driver: every mode writes the schema with positive finite rates; the analytic FLOP count
matches XLA's own count; the capture window opens and closes at exactly the configured steps."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest
from conftest import BENCHMARK_KEYS

from dlas_compare import benchmark, benchmark_session, benchmark_timing
from shared_data.core import config as config_mod
from shared_data.model import unet_spec
from shared_data.runtime import nvtx


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_every_mode_writes_the_schema(tiny_cfg, framework, tmp_path):
    records = benchmark_session.Session(framework).run(tiny_cfg, benchmark.MODES, warmup=1, steps=2, windows=2)
    out = tmp_path / "r.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    for r, mode in zip(map(json.loads, out.read_text().splitlines()), benchmark.MODES):
        assert set(r) >= BENCHMARK_KEYS and r["mode"] == mode and r["framework"] == framework
        assert math.isfinite(r["samples_per_sec"]) and r["samples_per_sec"] > 0
        assert 0 < r["step_ms_p50"] <= r["step_ms_p90"] and r["global_batch"] == tiny_cfg.global_batch_size
        assert r["mfu"] is None  # no known peak for a CPU
        io_outran_step = records[0]["samples_per_sec"] >= records[1]["samples_per_sec"]  # IO vs SYNTHETIC (MODES order)
        drains = mode == "io" or (mode == "full" and not io_outran_step)
        assert r["warmup_steps"] == 1 and (r["drained_steps"] >= 1) == drains
    assert "samples/s" in benchmark.table(records)


@pytest.mark.parametrize("framework", ["jax", pytest.param("tf", marks=pytest.mark.slow)])
def test_full_takes_over_the_step_and_compiles_it_again_for_the_device_loader(tiny_cfg, framework):
    """FULL after SYNTHETIC takes over the compiled step: a host loader's batch is SYNTHETIC's, so the
    step is reused (``reused`` in the table's compile column); the ``device`` loader's batch holds the
    volume and the crop draws, so the step is compiled again and its seconds are FULL's own."""
    session = benchmark_session.Session(framework)
    _, host = session.run(tiny_cfg, ["synthetic", "full"], warmup=1, steps=2, windows=1)
    device_cfg = config_mod.replace(tiny_cfg, data_loader_config="device")
    _, device = session.run(device_cfg, ["synthetic", "full"], warmup=1, steps=2, windows=1)
    assert host["reused"] == ["train step"] and host["compile_sec"] == 0.0
    assert device["reused"] == [] and device["compile_sec"] > 0
    compile_column = [line.split()[-2] for line in benchmark.table([host, device]).splitlines()[2:]]
    assert compile_column == ["reused", f"{device['compile_sec']:.1f}"]


def test_a_missing_training_file_stops_before_the_step_compiles(tmp_path, monkeypatch, capsys):
    """IO and FULL read the training file: without it the benchmark ends in one line with the command
    that makes it, before any framework starts; SYNTHETIC needs no file."""
    from shared_data.core.errors import run_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(benchmark, "Session", None)  # nothing may be measured
    argv = ["--framework", "jax", "--config", "cpu_tiny", "--set", "train_path=data/train_96.h5", "--mode", "full"]
    assert run_cli(benchmark.main, argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: dataset file {tmp_path / 'data/train_96.h5'} not found; make it with: "
        "python -m shared_data.data.generate --out data/train_96.h5 --size 96 --seed 1"
    )


def test_window_sec_bounds_windows():
    """Blocking calls of 20 ms: with window_sec 0.05 the synced last warm-up call sizes windows at 3
    calls (ceil(0.05 / 0.02+)), far below the 100 steps asked for. Asynchronous calls (returning at
    once, the work waited for by sync: 20 ms per call) are bounded the same way by the probe."""
    import time

    call = lambda: time.sleep(0.02)
    warm, per_call, counts = benchmark_timing.timed_windows(call, lambda _: None, 1, 100, 2, window_sec=0.05)
    assert all(1 <= n <= 3 for n in counts) and all(t >= 0.02 for t in per_call) and warm >= 0.02
    pending = []
    sync = lambda _: (time.sleep(0.02 * len(pending)), pending.clear())
    counts = benchmark_timing.timed_windows(lambda: pending.append(1), sync, 1, 100, 2, window_sec=0.05)[2]
    assert all(1 <= n <= 3 for n in counts)
    assert benchmark_timing.timed_windows(lambda: None, lambda _: None, 0, 5, 3)[2] == [5, 5, 5]


def test_min_steps_floor_holds_slow_steps_and_steps_caps_it():
    """Calls of 30 ms with windows of 10 ms: without a floor each window holds one call (the first
    already passes 10 ms); with min_steps 4 each holds exactly 4 (120 ms, past window_sec, but the
    floor wins), and the floor never exceeds --steps (3). Warm-up 3: two calls, then the synced one
    that sizes the windows, 3 x 30 ms in all."""
    import time

    call = lambda: time.sleep(0.03)
    assert benchmark_timing.timed_windows(call, lambda _: None, 0, 40, 2, window_sec=0.01)[2] == [1, 1]
    warm, per_call, counts = benchmark_timing.timed_windows(
        call, lambda _: None, 3, 40, 2, window_sec=0.01, min_steps=4
    )
    assert counts == [4, 4] and all(0.03 <= t < 0.05 for t in per_call) and 0.09 <= warm < 0.15
    assert benchmark_timing.timed_windows(call, lambda _: None, 0, 3, 2, window_sec=0.01, min_steps=4)[2] == [3, 3]


def test_analytic_flops_match_xla_cost_analysis():
    """Forward pass of the full-size net written with the contract's plain convolutions (strided
    down-convs, input-dilated transposed convs): XLA's HLO cost analysis, which counts only taps
    that meet real voxels, agrees with our count of those within 2%; the dense count (MFU's) is
    the documented ~27.2 GFLOP forward, 81.5 per training step."""
    from jax_impl import model as model_mod

    cfg = config_mod.load_config("base", overrides={"upconv": "transpose", "downconv": "strided"})
    model = model_mod.build_model(cfg)
    x = jax.ShapeDtypeStruct((1, 64, 64, 64, 4), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)
    cost = jax.jit(model.apply).lower(params, x).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ours = unet_spec.forward_flops(cfg, count_padding=False)
    assert abs(cost["flops"] - ours) / ours < 0.02, (cost["flops"], ours)
    assert 27.1e9 < unet_spec.forward_flops(cfg) < 27.3e9
    assert 81e9 < unet_spec.train_flops_per_sample(cfg) < 82e9  # the model contract: about 82 GFLOP per sample and step


def test_capture_window_starts_and_stops_at_configured_steps(monkeypatch):
    calls = []
    monkeypatch.setattr(nvtx, "cuda_profiler_call", lambda which: calls.append(which) or True)
    trace = []
    window = nvtx.CaptureWindow(
        [3, 6], on_start=[lambda: trace.append("start")], on_stop=[lambda: trace.append("stop")]
    )
    seen = []
    for step in range(10):
        window.before_step(step)
        seen.append((step, window.active, list(calls)))
    window.close()
    assert calls == ["cudaProfilerStart", "cudaProfilerStop"] and trace == ["start", "stop"]
    assert [s for s, active, _ in seen if active] == [3, 4, 5]
    assert (
        seen[2][2] == []
        and seen[3][2] == ["cudaProfilerStart"]
        and seen[6][2] == ["cudaProfilerStart", "cudaProfilerStop"]
    )
    off = nvtx.CaptureWindow(None)
    for step in range(5):
        off.before_step(step)
    assert calls == ["cudaProfilerStart", "cudaProfilerStop"]


@pytest.mark.slow
def test_layer_bench_times_each_formulation_and_counts_layer_flops(tmp_path):
    """dlas_compare.layer_bench on two layers of the tiny net: one row per JAX formulation, positive times,
    and per-layer model FLOPs that add up to the whole net's analytic training FLOPs."""
    from dlas_compare import layer_bench

    cfg = config_mod.load_config("cpu_tiny")
    out = tmp_path / "layers.jsonl"
    assert (
        layer_bench.main(
            [
                "--config",
                "cpu_tiny",
                "--local_batch_size",
                "1",
                "--layers",
                "down1,last",
                "--no-torch",
                "--warmup",
                "1",
                "--steps",
                "1",
                "--windows",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["layer"], r["variant"]) for r in rows] == [
        ("down1", "jax space_to_depth"),
        ("down1", "jax strided"),
        ("last", "jax subpixel"),
        ("last", "jax phases"),
        ("last", "jax transpose"),
    ]
    assert all(r["ms"] > 0 and math.isfinite(r["tflops"]) and r["batch"] == 1 for r in rows)
    total = sum(layer_bench.layer_model_flops(s, 1) for s in unet_spec.layer_specs(cfg))
    assert total == pytest.approx(unet_spec.train_flops_per_sample(cfg), rel=1e-12)


def test_run_process_returns_appended_records_and_why_it_failed(tmp_path):
    """A command that appends a record and fails, one that times out, one that succeeds: the
    records it appended (not the file's earlier ones), the failure sentence, the output."""
    import sys

    out = tmp_path / "r.jsonl"
    out.write_text('{"old": 1}\n')
    write = f"open({str(out)!r}, 'a').write('{{\"new\": 2}}\\n')"
    failing = [sys.executable, "-c", f"import sys; {write}; print('first\\nlast words', file=sys.stderr); sys.exit(3)"]
    records, failure, output = benchmark.run_process(failing, out, 60)
    assert records == [{"new": 2}] and failure == "exit 3: last words" and output == "first\nlast words"
    slow = "import sys, time; print('started', file=sys.stderr, flush=True); time.sleep(5)"
    records, failure, output = benchmark.run_process([sys.executable, "-c", slow], out, 1.0)
    assert records == [] and failure == "timed out after 1 s" and output == "started"  # what it said before
    records, failure, output = benchmark.run_process([sys.executable, "-c", f"{write}; print('done')"], out, 60)
    assert records == [{"new": 2}] and failure is None and output == "done"
    assert len(out.read_text().splitlines()) == 3


def test_run_process_echoes_the_stages_as_they_come(tmp_path, capfd):
    """With ``echo`` the child's stderr lines reach this process's stderr, prefixed, before it ends."""
    import sys
    import threading
    import time

    out = tmp_path / "r.jsonl"
    child = (
        "import sys, time; print('stage 1', file=sys.stderr, flush=True); time.sleep(3); "
        "print('stage 2', file=sys.stderr)"
    )
    proc = [sys.executable, "-c", child]
    seen = []

    def watch():
        time.sleep(1.5)
        seen.append(capfd.readouterr().err)

    watcher = threading.Thread(target=watch)
    watcher.start()
    records, failure, output = benchmark.run_process(proc, out, 60, echo="[compare jax] ")
    watcher.join()
    assert seen == ["[compare jax] stage 1\n"]  # while the child still runs
    assert capfd.readouterr().err == "[compare jax] stage 2\n"
    assert failure is None and output == "stage 1\nstage 2"


@pytest.mark.slow
def test_rungs_share_one_process_and_a_failing_one_keeps_the_others_records(tiny_cfg, tmp_path, capsys):
    """--rungs, JAX: rung 1 (IO, SYNTHETIC, FULL on 1 lowmem worker) compiles the step once, its FULL
    takes over SYNTHETIC's step and IO's pipeline (no compile); rung 2 (2 workers: only the input
    differs) reuses the step; rung 3 (FULL alone, DALI); every IO and FULL drains between 1 step and
    its pipeline's depth + DRAIN_EXTRA (lowmem: workers + 1 and the transfer queue 2, + 4: at most 9;
    DALI's reader: the transfer queue 2 and DALI's 2, + 4: 8), and SYNTHETIC none; rung 4 names an
    unknown key: one error line, and rungs 1-3 keep their records."""
    from shared_data.core.errors import run_cli

    plan, out = tmp_path / "rungs.json", tmp_path / "records.jsonl"
    rung = lambda step, *args: {"args": [*args, "--label", f"rung {step}"], "record": {"ladder_step": step}}
    plan.write_text(json.dumps([
        rung(1, "--mode", "io", "synthetic", "full", "--data_loader_config", "lowmem", "--num_data_workers", "1"),
        rung(2, "--mode", "io", "full", "--data_loader_config", "lowmem", "--num_data_workers", "2"),
        rung(3, "--mode", "full", "--data_loader_config", "dali-npy", "--num_data_workers", "1"),
        rung(4, "--mode", "full", "--set", "no_such_key=1"),
    ]))  # fmt: skip
    config = ["--config", "cpu_tiny"] + [
        a for k in ("train_path", "val_path", "xla_cache_dir") for a in ("--set", f"{k}={getattr(tiny_cfg, k)}")
    ]
    argv = ["--framework", "jax", *config, "--warmup", "1", "--steps", "2", "--windows", "2", "--window_sec", "5"]
    assert run_cli(benchmark.main, [*argv, "--min_window_steps", "2", "--rungs", str(plan), "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: override 'no_such_key=1': unknown key")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    got = [(r["ladder_step"], r["mode"], r["reused"], r["warmup_steps"]) for r in records]
    assert got == [
        (1, "io", [], 1),
        (1, "synthetic", [], 1),
        (1, "full", ["train step", "input pipeline"], 1),
        (2, "io", [], 1),
        (2, "full", ["train step", "input pipeline"], 1),
        (3, "full", ["train step"], 1),
    ]
    caps = [2 + 2 + 4 if r["loader"] == "dali-npy" else r["config_values"]["num_data_workers"] + 1 + 2 + 4
            for r in records]  # fmt: skip
    assert records[1]["drained_steps"] == 0 and caps[-1] == benchmark_timing.prefetch_depth(
        config_mod.replace(tiny_cfg, data_loader_config="dali-npy")) + benchmark_timing.DRAIN_EXTRA  # fmt: skip
    step_rate = records[1]["samples_per_sec"]  # one train step (cpu_tiny) for the three rungs
    io_rate = {r["ladder_step"]: r["samples_per_sec"] for r in records if r["mode"] == "io"}
    drained = [r["drained_steps"] for r in records]
    want = [
        r["mode"] == "io" or (r["mode"] == "full" and io_rate.get(r["ladder_step"], 0) < step_rate) for r in records
    ]
    assert [d >= 1 for d in drained] == want and all(d <= cap for d, cap in zip(drained, caps))
    assert records[1]["compile_sec"] > 0 and {r["compile_sec"] for r in records[2:]} == {0.0}
    assert all(r["window_steps"] == [2, 2] and r["min_window_steps"] == 2 and r["rung_sec"] > 0 for r in records)
    assert [r["config_values"]["num_data_workers"] for r in records] == [1, 1, 1, 2, 2, 1]


class _Producer:
    """A loader: a thread puts one batch every ``period`` seconds into a queue of ``depth`` (and holds
    one more while the queue is full), whenever nobody consumes."""

    def __init__(self, period: float, depth: int):
        import queue
        import threading

        self.period, self.queue, self.stop = period, queue.Queue(depth), threading.Event()
        threading.Thread(target=self._produce, daemon=True).start()

    def _produce(self):
        while not self.stop.wait(self.period):
            self.queue.put(object())

    def __next__(self):
        return self.queue.get()

    def close(self):
        self.stop.set()


class _FakeBench:
    """A bench on a :class:`_Producer` (IO: a pull; FULL: a pull and a 5 ms step; SYNTHETIC: the step)
    whose set-up pauses ``PAUSE`` seconds, as compiling or a previous mode does, so its loader's
    queue fills before the timing starts."""

    framework, global_batch, compile_sec, compiled_step, PERIOD, PAUSE = "jax", 4, 0.0, False, 0.05, 0.6

    def __init__(self, cfg, mode, num_devices=None, step_from=None, input_from=None):
        import time

        self.mode = mode
        if mode != "synthetic":
            depth = benchmark_timing.prefetch_depth(cfg)
            self.batches = input_from.batches if input_from else _Producer(self.PERIOD, depth)
            time.sleep(self.PAUSE)

    def step(self):
        import time

        if self.mode != "io":
            time.sleep(0.005)
        if self.mode != "synthetic":
            next(self.batches)

    sync = lambda self: None
    device_name = lambda self: "fake"
    versions = lambda self: {}
    peak_memory_bytes = lambda self: None


@pytest.mark.slow  # seconds of real waiting: the fast tier stays under a minute
def test_drain_measures_the_loader_not_its_read_ahead(monkeypatch):
    """A loader of 4 workers (queue of prefetch_depth 7, plus the batch its producer holds) making a
    batch of 4 every 50 ms: 80 samples/s. IO's pipeline and FULL (taking it over) each start after a
    0.6 s pause that fills the queue; without a drain the 2 warm-up steps and the window-sizing step
    leave 5 queued batches for the first 0.25 s window (~10 steps: 13 + 80 samples/s x 5/10 off, a
    median of 2 windows ~40% over). The drain takes the 8 queued batches and the first waiting
    pull, so both rates are within 10% of 80 and the record says what it drained."""
    cfg = config_mod.load_config("cpu_tiny", overrides={"num_data_workers": 4})
    monkeypatch.setattr(benchmark_session, "make_bench", lambda framework, *a, **k: _FakeBench(*a, **k))
    session = benchmark_session.Session("jax")
    io, full = session.run(cfg, ["io", "full"], warmup=2, steps=40, windows=2, window_sec=0.25, min_steps=5)
    true_rate = _FakeBench.global_batch / _FakeBench.PERIOD
    for r in (io, full):
        assert abs(r["samples_per_sec"] / true_rate - 1) < 0.1, (r["mode"], r["samples_per_sec"])
        assert 7 <= r["drained_steps"] <= benchmark_timing.prefetch_depth(cfg) + benchmark_timing.DRAIN_EXTRA


class _FastLoaderBench(_FakeBench):
    """A step of 30 ms (SYNTHETIC 133 samples/s) fed by a loader of 200 samples/s: the loader outruns it."""

    PERIOD, PAUSE = 0.02, 0.1

    def step(self):
        import time

        if self.mode != "io":
            time.sleep(0.03)
        if self.mode != "synthetic":
            next(self.batches)


def test_full_is_not_drained_where_its_io_outran_the_step(monkeypatch):
    """FULL after an IO faster than the step's SYNTHETIC in the same session takes no drain (its queue
    cannot lift it above the step); IO is drained, and FULL without this session's IO is too."""
    cfg = config_mod.load_config("cpu_tiny", overrides={"num_data_workers": 1})
    monkeypatch.setattr(benchmark_session, "make_bench", lambda framework, *a, **k: _FastLoaderBench(*a, **k))
    session = benchmark_session.Session("jax")
    syn, io, full = session.run(cfg, ["synthetic", "io", "full"], warmup=1, steps=3, windows=1)
    assert io["samples_per_sec"] > syn["samples_per_sec"]
    assert io["drained_steps"] >= 1 and full["drained_steps"] == 0
    (alone,) = session.run(cfg, ["full"], warmup=1, steps=3, windows=1)
    assert alone["drained_steps"] >= 1


def test_drain_stops_at_the_first_wait_and_at_its_cap():
    """Calls of 20 ms from a queue of 3, then 300 ms waits: the drain takes the 3 fast calls and the
    first slow one (4); calls that never wait (a consumer slower than its loader) stop at the cap;
    an empty queue (every call 300 ms, but the one after the drain's pause of 300 ms finds the batch
    made meanwhile: 20 ms) stops after that call (2), having paused once. The times are long enough
    that a busy machine's scheduling delays (tens of ms) do not turn a fast call into a wait."""
    import time

    times = iter([0.02] * 3 + [0.3] * 10)
    assert benchmark_timing.drain(lambda: time.sleep(next(times)), lambda _: None, 10) == 4
    assert benchmark_timing.drain(lambda: time.sleep(0.05), lambda _: None, 6) == 6
    times = iter([0.3, 0.02, 0.3, 0.3])
    t0 = time.perf_counter()
    assert benchmark_timing.drain(lambda: time.sleep(next(times)), lambda _: None, 10) == 2
    assert 0.62 <= time.perf_counter() - t0 < 0.9  # a third call would add 0.3 s


def test_drain_of_an_empty_queue_costs_two_batches(monkeypatch):
    """The loader of the test above (80 samples/s) with no pause: IO's pipeline is consumed from its
    start, so its queue is empty; the drain ends after its second call (~2 batch periods, 0.1 s), or
    its third where a busy machine delays the loader's worker past the drain's pause; never near its
    cap."""
    monkeypatch.setattr(_FakeBench, "PAUSE", 0.0)
    cfg = config_mod.load_config("cpu_tiny", overrides={"num_data_workers": 4})
    monkeypatch.setattr(benchmark_session, "make_bench", lambda framework, *a, **k: _FakeBench(*a, **k))
    (io,) = benchmark_session.Session("jax").run(
        cfg, ["io"], warmup=2, steps=40, windows=1, window_sec=0.25, min_steps=5
    )
    assert io["drained_steps"] in (2, 3) and abs(io["samples_per_sec"] / 80 - 1) < 0.1


def test_prefetch_depth_counts_the_queues_each_loader_has():
    """lowmem with 4 workers: 4 + 1 read ahead and JAX's transfer queue of 2 (7; PyTorch copies in its
    loader: 5); DALI's numpy reader: no host workers, the transfer queue 2 and DALI's queue (2): 4;
    dali-h5's Python workers read ahead like the host loaders' (9); the device loader: 2."""
    cfg = config_mod.load_config("cpu_tiny", overrides={"num_data_workers": 4, "dali_prefetch_queue_depth": 2})
    depth = lambda loader, fw="jax": benchmark_timing.prefetch_depth(
        config_mod.replace(cfg, data_loader_config=loader), fw
    )
    assert (depth("lowmem"), depth("lowmem", "torch"), depth("dali-npy"), depth("dali-h5"), depth("device")) == (
        7,
        5,
        4,
        9,
        2,
    )


@pytest.fixture(scope="module")
def jax_replica_check(tiny_cfg):
    """Two FULL steps of cpu_tiny from its initial weights on 1 and on 2 CPU devices at a global batch
    of 2 x 4 (the data-parallel rung's)."""
    rung = config_mod.replace(tiny_cfg, local_batch_size=tiny_cfg.global_batch_size)
    return benchmark_session.replica_check("jax", rung, 2, 2)


@pytest.mark.slow
def test_replica_check_compares_one_device_with_the_replicas(jax_replica_check, tiny_cfg):
    check = jax_replica_check
    assert (check["replicas"], check["global_batch"], check["steps"]) == (2, 2 * tiny_cfg.global_batch_size, 2)
    pairs = list(zip(check["losses_one_device"], check["losses_replicas"]))
    assert len(pairs) == 2 and all(0 < a < 1 and 0 < b < 1 for a, b in pairs)  # L1 of tanh outputs
    assert check["max_rel_diff"] == max(abs(a - b) / a for a, b in pairs)
    assert check["equal"] == (check["max_rel_diff"] <= benchmark_session.SAME_LOSS_RTOL == check["rtol"])
    with pytest.raises(SystemExit):  # argparse: --replica_check needs a count >= 1
        benchmark.build_parser().parse_args(["--replica_check", "0"])
    with pytest.raises(benchmark.UserError, match="--replica_check needs --num_devices N with N >= 2"):
        benchmark.main(["--config", "cpu_tiny", "--replica_check", "2"])


@pytest.mark.slow
def test_two_replicas_train_as_one_device(jax_replica_check):
    """One global batch per step whatever the world size: 2 CPU devices give 1 device's losses."""
    assert jax_replica_check["equal"], jax_replica_check
