"""The run around the trainers (shared_data/runtime: run_folder, steps, epoch_report, saves, preemption):
logs for batch jobs, out.log and run.json, the progress bar only on a terminal, TensorBoard under the
tutorial's tags, the input wait and the input-bound sentence, the tutorial's flags."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time

import pytest
from conftest import read_tensorboard, run_module

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError
from shared_data.data import generate
from shared_data.runtime import cli, logs, nvtx, preemption, records, saves, steps
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.run_folder import RunFolder, workdir_for


def test_other_ranks_log_warnings_only_with_a_rank_tag(capsys):
    log = logging.getLogger("dlas.test")
    try:
        logs.setup_logging(1)
        log.info("an epoch line")
        log.warning("a warning")
        logs.setup_logging(0)
        log.info("rank 0 info")
    finally:
        root = logging.getLogger()
        for h in [h for h in root.handlers if getattr(h, "_dlas", False)]:
            root.removeHandler(h)  # bound to the captured stdout, which closes after this test
    out = capsys.readouterr().out
    assert "an epoch line" not in out
    assert "[rank 1] WARNING a warning" in out
    assert "rank 0 info" in out and "[rank" not in out.split("a warning")[1]


def test_progress_bar_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    it = logs.progress(range(3), 3, "epoch 1", enabled=True)
    assert type(it).__name__ == "range_iterator"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    it = logs.progress(range(3), 3, "epoch 1", enabled=True)
    assert type(it).__name__ != "range_iterator" and list(it) == [0, 1, 2]
    assert type(logs.progress(range(3), 3, "x", enabled=False)).__name__ == "range_iterator"


def _epoch(folder, report, epoch, batches, drain=None, dispatch=lambda: None, end=lambda: None) -> dict:
    """One epoch's steps timed as the trainers time them (``drain``: the device drained before the
    wait of each sampled step and until its batch is computed; None: every step's plain wait;
    ``end()``: the wait for the epoch's last step), then the epoch's report (losses 0.1, validation
    loss 0.1)."""
    timing = steps.EpochTiming(folder.steps_per_epoch)
    for i in steps.epoch_steps(folder, epoch):
        timed = timing.sampled(i) if drain else True
        if timed and drain:
            drain(None)
        with timing.input_wait(timed):
            batch = next(batches)
            if timed and drain:
                drain(batch)
        dispatch()
    end()
    timing.stop()
    n = folder.steps_per_epoch
    return report.epoch(epoch, timing, [0.1] * n, 0.1, step=(epoch + 1) * n)


def _open(cfg, workdir):
    folder = RunFolder(cfg, workdir, "jax", "test", {}, 1)
    report = EpochReport(folder, 0.0)
    report.begin(0, {})
    return folder, report


def test_input_bound_run_says_so_once(tiny_cfg, tmp_path, caplog):
    """A loader that takes 30 ms per batch and an instant step: the share line shows ~100% input wait
    and, from the second epoch on, one sentence names the fix for the lowmem loader."""
    folder, report = _open(config_mod.replace(tiny_cfg, num_epochs=3), tmp_path / "w")

    def slow():
        while True:
            time.sleep(0.03)
            yield {}

    with caplog.at_level(logging.INFO, logger="dlas"):
        for epoch in folder.epochs(0):
            assert _epoch(folder, report, epoch, slow())["input_wait_share"] > 0.9
    text = caplog.text
    assert text.count("This run is input-bound") == 1
    assert "waited for input" in text and "epoch 2" in text and "more num_data_workers" in text
    assert "Input wait 9" in text or "Input wait 100" in text


class SimClock:
    """A simulated clock for ``run``'s timing: ``sleep`` advances it, nothing else does, so the shares
    below are exact (no timed unit test)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(0.0, seconds)

    def strftime(self, *args):
        return time.strftime(*args)


class AsyncDevice:
    """A device that runs each dispatched step for ``step_sec`` after the last one while the host goes on
    (the host's clock does not move); ``drain`` waits until the queued steps are done."""

    def __init__(self, clock, step_sec):
        self.clock, self.step_sec, self.busy_until = clock, step_sec, 0.0

    def dispatch(self):
        self.busy_until = max(self.busy_until, self.clock.now) + self.step_sec

    def drain(self, _batch=None):
        self.clock.sleep(self.busy_until - self.clock.now)


def _one_epoch_share(tmp_path, tiny_cfg, monkeypatch, batches, device, sync):
    """The input share of one epoch of 64 steps on ``device``, timed by its simulated clock (``sync``:
    the trainers' drains; None: every step's plain wait)."""
    monkeypatch.setattr(steps, "time", device.clock)
    cfg = config_mod.replace(tiny_cfg, num_epochs=1, Nsamples=64 * tiny_cfg.global_batch_size)
    folder, report = _open(cfg, tmp_path / "w")
    return _epoch(folder, report, 0, batches, sync, device.dispatch, device.drain)["input_wait_share"]


def test_a_checkpoint_save_says_its_seconds(tiny_cfg, tmp_path, monkeypatch, caplog):
    """A save that takes 1.5 s of the (simulated) clock: one line after the epoch's lines says so."""
    clock = SimClock()
    monkeypatch.setattr(saves, "time", clock)
    folder = RunFolder(config_mod.replace(tiny_cfg, num_epochs=1), tmp_path / "w", "jax", "test", {}, 1)
    previous = saves.InFlight("test")
    previous.start(0, lambda: clock.sleep(4.0))  # the previous save: its write is not on the path
    with caplog.at_level(logging.INFO, logger="dlas"), saves.saving(folder, 1, previous):
        clock.sleep(1.5)
    previous.close()
    assert [m for m in caplog.messages if "Checkpoint" in m or "background" in m] == [
        "checkpoint of epoch 0 written in the background in 4.00 s",
        "  Checkpoint time: 1.5 sec",
    ]


class _FailedSave:
    """A ``Checkpoints`` whose save in flight failed."""

    def wait(self):
        raise UserError("cannot write the checkpoint of epoch 2 (No space left on device); epoch 1 is kept")


def test_a_failed_background_save_is_the_error_a_run_ends_with(caplog):
    """At close: with nothing propagating, the failed save is raised; in place of a user error that a full
    disk caused after the save began (a record's write), the save is raised and that error logged;
    a stop signal goes on, the save's line logged."""
    with pytest.raises(UserError, match="checkpoint of epoch 2"):
        saves.wait_at_close(_FailedSave())
    with pytest.raises(UserError, match="checkpoint of epoch 2"), caplog.at_level(logging.ERROR, logger="dlas"):
        try:
            raise UserError("cannot write metrics.jsonl (No space left on device)")
        except UserError:
            saves.wait_at_close(_FailedSave())
    assert "cannot write metrics.jsonl" in caplog.text
    with pytest.raises(KeyboardInterrupt, match="stop"):
        try:
            raise KeyboardInterrupt("stop")
        except KeyboardInterrupt:
            saves.wait_at_close(_FailedSave())  # returns: the signal goes on, as out of a with block's exit
            raise
    assert caplog.text.count("checkpoint of epoch 2") == 1


class _SaveHeldByALostProcess:
    """A ``Checkpoints`` whose save of epoch 3 waits (as orbax's last barrier waits for a lost process)
    until ``release`` is set; epochs 1 and 2 are finished."""

    def __init__(self):
        import threading

        self.release = threading.Event()
        self.in_flight = saves.InFlight("test")
        self.in_flight.start(3, self.release.wait)

    def epochs(self):
        return [1, 2]


def test_a_save_a_lost_process_holds_is_left_and_the_run_names_the_newest_finished_checkpoint():
    """After a lost process: a save that does not end within LOSS_WAIT_S is left running, and the run's
    position names epoch 2 (the newest finished) instead of 3; a save that ends in time changes nothing."""
    from shared_data.runtime.position import Position

    held, position = _SaveHeldByALostProcess(), Position(steps_per_epoch=4)
    position.start_epoch(2)
    position.saved(3)
    position.start_epoch(3)
    t0 = time.monotonic()
    saves.leave_after_loss(held.in_flight, held.epochs, position)
    assert saves.LOSS_WAIT_S <= time.monotonic() - t0 < saves.LOSS_WAIT_S + 1
    assert position.where() == (
        "during epoch 4 (step 1 of 4): that epoch is abandoned; the checkpoint of epoch 2 is kept and --resume "
        "continues from it"
    )
    held.release.set()
    done, position = _SaveHeldByALostProcess(), Position(steps_per_epoch=4)
    done.release.set()
    position.saved(3)
    saves.leave_after_loss(done.in_flight, done.epochs, position)
    assert position.kept() == "the checkpoint of epoch 3 is kept and --resume continues from it"
    assert done.in_flight.wait() is None  # joined by leave_after_loss


def test_input_wait_leaves_out_the_steps_queued_before_the_batch(tiny_cfg, tmp_path, monkeypatch):
    """64 steps of 10 ms on an asynchronous device and a loader whose instant batch waits behind the queued
    step (as a gather on the GPU does): the host's plain wait calls 63 of the 64 steps input (the first
    batch has nothing to wait for); measured after draining the device (``sync``) it is 0, the loader's
    true cost."""
    device = AsyncDevice(SimClock(), 0.010)

    def behind_the_queue():
        while True:
            device.drain()
            yield {}

    plain = _one_epoch_share(tmp_path / "plain", tiny_cfg, monkeypatch, behind_the_queue(), device, None)
    assert plain == pytest.approx(63 / 64)
    device = AsyncDevice(SimClock(), 0.010)
    assert _one_epoch_share(tmp_path / "sync", tiny_cfg, monkeypatch, behind_the_queue(), device, device.drain) == 0.0


def test_sampled_input_wait_of_a_slow_loader(tiny_cfg, tmp_path, monkeypatch):
    """A loader of 10 ms a batch and 1-ms steps that overlap it: 64 x 10 ms of input in an epoch of
    641 ms (the last step ends 1 ms after the last batch) when every step's wait is timed. Measured on
    32 of the 64 steps (every second one) the mean wait is the same 10 ms, and each drain before a
    sampled step costs the 1 ms that step would have overlapped: 640 of 673 ms."""
    monkeypatch.setattr(steps, "WAIT_SAMPLES", 32)

    def slow(clock):
        while True:
            clock.sleep(0.010)
            yield {}

    device, drains = AsyncDevice(SimClock(), 0.001), []

    def sync(batch):
        drains.append(batch)
        device.drain()

    sampled = _one_epoch_share(tmp_path / "sync", tiny_cfg, monkeypatch, slow(device.clock), device, sync)
    assert drains.count(None) == 32 and len(drains) == 64  # before and after each sampled step
    device = AsyncDevice(SimClock(), 0.001)
    every = _one_epoch_share(tmp_path / "plain", tiny_cfg, monkeypatch, slow(device.clock), device, None)
    assert sampled == pytest.approx(640 / (640 + 32 + 1)) and every == pytest.approx(640 / 641)


def test_a_finished_run_resumed_says_there_is_nothing_to_train(tiny_cfg, tmp_path, caplog):
    folder = RunFolder(config_mod.replace(tiny_cfg, num_epochs=2), tmp_path / "w", "jax", "test", {}, 1)
    with caplog.at_level(logging.INFO, logger="dlas"):
        assert list(folder.epochs(1)) == [1] and "nothing to do" not in caplog.text
        assert list(folder.epochs(2)) == []
    assert "all 2 epochs of this run are trained: nothing to do (--set num_epochs=N" in caplog.text


def _train(*args, cwd):
    return run_module("jax_impl.train", *args, cwd=cwd)


@pytest.mark.slow
def test_run_folder_records_and_tensorboard_tags(tmp_path, tiny_argv):
    """A run and its resume in one folder: out.log holds everything both printed, run.json both
    invocations (command line, config, code version, library versions), TensorBoard the tutorial's
    tags with the step as x axis and a step-0 loss; a run folder under the current folder."""
    common = [
        *tiny_argv,
        "--set",
        "tensorboard=true",
        "--set",
        f"xla_cache_dir={tmp_path / 'c'}",
        "--num_epochs",
        "2",
        "--run_num",
        "07",
    ]
    first = _train(*common, "--stop_after_epoch", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    second = _train(*common, "--resume", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    folder = tmp_path / "runs" / "cpu_tiny" / "07" / "jax"
    out_log = (folder / "out.log").read_text()
    assert out_log.count("Time taken for epoch 1 is") == 1 and out_log.count("Time taken for epoch 2 is") == 1
    assert out_log.count("precision: float32 compute") == 2 and "resumed from" in out_log
    info = json.loads((folder / "run.json").read_text())
    assert info["framework"] == "jax" and info["config"] == "cpu_tiny"
    assert info["config_values"]["num_epochs"] == 2
    assert [i["start_epoch"] for i in info["invocations"]] == [0, 1]
    inv = info["invocations"][1]
    assert "--resume" in inv["command"] and "--run_num 07" in inv["command"]
    assert inv["code"].get("git_commit") or inv["code"].get("package_version")
    assert inv["versions"]["jax"] and inv["cwd"] == str(tmp_path)
    # which data: the generated files' generator version and models (conftest: the default generator)
    assert inv["data"]["train"]["generator"] == f"shared_data.data.generate v{generate.GENERATOR_VERSION}"
    data = inv["data"]
    assert (data["train"]["dm"], data["val"]["gas"], data["val"]["grid_size"]) == ("nbody", "nonlinear", 24)

    scalars, hparams = read_tensorboard(folder / "tb")
    assert {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"} <= set(scalars)
    assert hparams["framework"] == "jax" and hparams["num_epochs"] == 2  # written once, by the first invocation
    series = scalars.__getitem__

    steps_per_epoch = 16 // 4
    assert [s for s, _ in series("Loss/valid")] == [0, steps_per_epoch, 2 * steps_per_epoch]
    assert [s for s, _ in series("Loss/train")] == [0, steps_per_epoch, 2 * steps_per_epoch]
    metrics = records.read_metrics(folder)
    assert series("Loss/valid")[1][1] == pytest.approx(metrics[0]["val_loss"], rel=1e-6)
    assert series("Loss/train")[2][1] == pytest.approx(metrics[1]["train_loss"], rel=1e-6)


def test_tutorial_flags(tiny_cfg, tmp_path):
    parser = cli.build_parser("jax")
    args = parser.parse_args(["--config", "cpu_tiny", "--enable_amp", "--no-enable_jit", "--enable_manual_profiling"])
    cfg = config_cli.config_from_args(args)
    assert cfg.enable_amp and not cfg.enable_jit and cfg.enable_manual_profiling
    cfg = config_cli.config_from_args(parser.parse_args(["--config", "short_opt", "--no-enable_amp"]))
    assert cfg.enable_amp is False
    for flag, words in (
        ("--noddp", "--num_devices 1"),
        ("--bucket_cap_mb", "all-reduce"),
        ("--local_rank", "launcher"),
        ("--disable_broadcast_buffers", "no buffers"),
    ):
        argv = [flag] + (["25"] if flag in ("--bucket_cap_mb", "--local_rank") else [])
        with pytest.raises(UserError, match=rf"{flag} is PyTorch DDP's; not needed here: .*{words}"):
            cli.check_run_args(parser.parse_args(argv), tmp_path / "w", "jax")
    assert workdir_for(tiny_cfg, "jax", None, "03").parts[-3:] == ("cpu_tiny", "03", "jax")


def test_manual_profiling_window_is_the_tutorials(tiny_cfg, tmp_path):
    """--enable_manual_profiling without profile_steps: the capture window covers the first 60 steps
    of epoch 2 (the tutorial's ``epoch == 1 and i in [0, 59]``), clipped by the run's length."""
    cfg = config_mod.replace(tiny_cfg, enable_manual_profiling=True, num_epochs=3)
    calls = []
    with nvtx.capture_window(cfg, 4, lambda: calls.append("start"), lambda: calls.append("stop"), False) as window:
        assert (window.start, window.stop) == (4, 64)
        for step in range(70):
            window.before_step(step)
    assert calls == ["start", "stop"]
    window = nvtx.capture_window(config_mod.replace(cfg, profile_steps=(2, 5)), 4, print, print, False)
    assert (window.start, window.stop) == (2, 5)
    assert nvtx.capture_window(tiny_cfg, 4, print, print, False).start is None


@pytest.mark.slow
def test_enable_benchy_runs_the_benchmark_modes(tmp_path, tiny_argv):
    res = _train(
        *tiny_argv,
        "--set",
        f"xla_cache_dir={tmp_path / 'c'}",
        "--enable_benchy",
        cwd=REPO_ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "--enable_benchy: python -m dlas_compare.benchmark --framework jax --mode io synthetic full" in res.stdout
    for mode in ("io", "synthetic", "full"):
        assert f" {mode} " in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_profile_holds_the_nvtx_ranges(framework, tiny_cfg, tmp_path):
    """The capture window of profile_steps writes the framework's trace, and the kit's NVTX ranges
    are in it (TensorBoard's profile view shows them as Nsight Systems does)."""
    train_mod = importlib.import_module(f"{framework}_impl.train")
    train_mod.train_and_evaluate(config_mod.replace(tiny_cfg, profile_steps=(1, 3)), tmp_path / "run")
    (trace,) = (tmp_path / "run" / "profile").rglob("*.xplane.pb")
    data = trace.read_bytes()
    assert b"data wait" in data and b"step dispatch" in data


def test_a_requeued_slurm_job_resumes_without_the_flag():
    assert cli.resume_requested(False, True, {"SLURM_RESTART_COUNT": "2"}) == (True, False)
    assert cli.resume_requested(False, True, {"SLURM_RESTART_COUNT": "0"}) == (False, True)
    assert cli.resume_requested(True, False, {}) == (True, False)


def test_each_process_stop_line_says_what_resumes_it():
    """After a step-boundary save: process 0 says whether it requeued the job; another process of a
    SLURM job cannot know and says who decides; outside SLURM every process says --resume."""
    slurm = {"SLURM_JOB_ID": "7"}
    assert preemption.what_resumes(True, True, slurm) == "the job is requeued and resumes there"
    assert preemption.what_resumes(True, False, slurm) == "--resume continues from there"
    assert preemption.what_resumes(False, False, slurm) == (
        "process 0 requeues the job where SLURM allows it (sbatch --requeue), else --resume continues from there"
    )
    assert (
        preemption.what_resumes(False, False, {})
        == preemption.what_resumes(True, False, {})
        == "--resume continues from there"
    )


def test_requeue_outside_slurm_or_without_a_controller_is_refused_with_a_line(caplog, tmp_path, monkeypatch):
    """No SLURM_JOB_ID: nothing is asked. A job id that no reachable controller knows (scontrol
    missing, or no slurmctld): a warning, no exception, since the checkpoint is already written."""
    assert preemption.requeue_job({}) is False
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol on PATH
    with caplog.at_level(logging.WARNING, logger="dlas"):
        assert preemption.requeue_job({"SLURM_JOB_ID": "123"}) is False
    assert "not requeued" in caplog.text
