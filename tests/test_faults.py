"""Fault injection: what a hostile user or a failing machine does to a run, and the one line (or the
safe fallback) each gets. Processes are killed or signalled at chosen points, two trainers share a
folder, writes fail; every test runs on 2 CPU cores."""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time

import pytest
from conftest import (
    REPO_ROOT,
    RUN_OF_3_EPOCHS,
    assert_one_error_line,
    checkpoint_epochs,
    process_ended,
    run_in_process,
    run_module,
)
from processes import SIGNAL_AT

from shared_data.core.errors import UserError
from shared_data.runtime import checks, launch, records
from shared_data.runtime import lock as run_lock
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.run_folder import RunFolder

HOLD_LOCK = (
    "import sys, time; from pathlib import Path; from shared_data.runtime import lock; "
    "lock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 120) -> None:
    """Read ``proc``'s stdout until a line holds ``text``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"process ended ({proc.returncode}) before printing {text!r}")
    raise AssertionError(f"no {text!r} within {timeout} s")


def test_second_trainer_refuses_a_held_run_folder_and_takes_over_a_stale_lock(tiny_cfg, tmp_path, caplog):
    """Class 1: a folder locked by a live process is refused at once, naming host, pid and since when,
    before anything is written there; once that process is killed (-9, no clean-up) the lock is stale
    and the next run takes it over with a warning naming the dead holder."""
    workdir = tmp_path / "w"
    workdir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(workdir)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        _wait_for_line(holder, "held")
        t0 = time.monotonic()
        with pytest.raises(UserError) as err:
            RunFolder(tiny_cfg, workdir, "jax", "test", {}, 1)
        assert time.monotonic() - t0 < 5
        message = str(err.value)
        assert f"run folder {workdir} is in use by another trainer" in message
        assert f"host {platform.node()}, pid {holder.pid}, since 20" in message
        assert not (workdir / "out.log").exists()
    finally:
        holder.kill()
        holder.wait()
    with caplog.at_level(logging.WARNING, logger="dlas"):
        r = RunFolder(tiny_cfg, workdir, "jax", "test", {}, 1)
    assert f"from a trainer that is gone (host {platform.node()}, pid {holder.pid}" in caplog.text
    assert json.loads((workdir / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    r.close()
    assert (workdir / run_lock.LOCK_NAME).read_text() == ""  # released: the next run takes it silently


@pytest.mark.slow
def test_two_trainers_started_together_one_refuses(tmp_path, tiny_argv):
    """Class 1 end to end: two JAX trainers started at the same moment on one folder; one trains all
    epochs, the other ends in one error line naming the first, and metrics.jsonl holds one run."""
    argv = [*tiny_argv, "--set", "num_epochs=3", "--workdir", str(tmp_path / "w")]
    cmd = [sys.executable, "-m", "jax_impl.train", *argv]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT) for _ in range(2)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    winner = next(p for p in procs if p.returncode == 0)
    err = next(text for code, text in results if code == 2)
    refused = subprocess.CompletedProcess(cmd, 2, "", err)
    assert_one_error_line(refused, "is in use by another trainer", f"pid {winner.pid}")
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]


def _descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (a lowmem loader's forkserver and workers), from /proc.
    A thread that ends while it is read (a checkpoint writer's, say) has no children left to list."""
    children = []
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            with open(f"{task.path}/children") as fh:
                children += [int(c) for c in fh.read().split()]
        except FileNotFoundError:
            continue
    return [p for c in children for p in (c, *_descendants(c))]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "signum", "code"), [("jax", signal.SIGINT, 130), ("tf", signal.SIGTERM, 143)])
def test_a_signal_mid_epoch_ends_in_one_line_and_resume_continues(
    tmp_path, tiny_argv, monkeypatch, framework, signum, code
):
    """Class 7: Ctrl-C in the middle of epoch 2 ends with one line that says the epoch is abandoned
    and which checkpoint is kept, exit 130; SIGTERM (a job's time limit, ``scancel``) saves at the
    next step boundary with the data cursor and says so, exit 143. No traceback, no C++ abort; the
    lock is released; --resume (or, for the SIGTERM run, a requeued job's SLURM_RESTART_COUNT
    without --resume) trains epoch 2 again from its start or from the cursor. The signal goes to every
    process of the run, as a terminal's Ctrl-C and SLURM's SIGTERM do: the lowmem loader's workers
    leave it to the trainer and end with it."""
    workdir = tmp_path / "w"
    steps = 4
    # one device: XLA:CPU's in-process all-reduce over 2 forced host devices can stall on long runs
    # on 2 shared cores, signal or not
    argv = [
        *tiny_argv,
        "--set",
        "num_epochs=2",
        "--set",
        f"Nsamples={4 * steps}",
        "--num_devices",
        "1",
        "--workdir",
        str(workdir),
    ]
    waiting = tmp_path / "waiting"  # the trainer waits for the signal in step 2 of epoch 2 and stops before step 3
    cmd = [*SIGNAL_AT, str(steps + 1), f"wait:{waiting}", "-m", f"{framework}_impl.train", *argv]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, start_new_session=True
    )
    _until_created(waiting, proc)
    workers = _descendants(proc.pid)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    alive = [p for p in workers if not process_ended(p)]
    for p in alive:  # not ours to leave running whatever the outcome
        os.kill(p, signal.SIGKILL)
    assert proc.returncode == code, err[-2000:]
    assert len(workers) >= 3 and not alive, (workers, alive)  # resource tracker, forkserver, its workers
    assert "Traceback" not in err and "terminate called" not in err, err[-2000:]
    name = signal.Signals(signum).name
    last = err.strip().splitlines()[-1]
    assert checkpoint_epochs(workdir / "checkpoints") == [1]
    assert (workdir / run_lock.LOCK_NAME).read_text() == ""
    if signum == signal.SIGINT:
        assert last == (
            f"stopped by {name} during epoch 2 (step 3 of {steps}): that epoch is abandoned; the checkpoint of "
            "epoch 1 is kept and --resume continues from it"
        ), last
        argv.append("--resume")
    else:
        where = f"at epoch 2, step 3 of {steps}: saved in {workdir / 'mid_epoch'}"
        assert last == f"stopped by {name} {where}; --resume continues from there", last
        cursor = json.loads((workdir / "mid_epoch" / "cursor.json").read_text())
        assert cursor["epoch"] == 1 and cursor["step"] == 2 and len(cursor["losses"]) == cursor["step"]
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    res = run_in_process(__import__(f"{framework}_impl.train", fromlist=["train"]).main, argv)
    assert res.returncode == 0 and "taking over" not in res.stderr, res.stderr[-2000:]
    epochs = [json.loads(line)["epoch"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    if signum == signal.SIGTERM:
        assert f"resumed from {workdir / 'mid_epoch'} at epoch 2, step {cursor['step'] + 1}" in res.stdout


def _until_created(marker, proc, seconds: float = 300) -> None:
    """Wait until ``proc`` creates ``marker`` (``processes.SIGNAL_AT``'s actions do), ends, or
    ``seconds`` pass."""
    end = time.monotonic() + seconds
    while not marker.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)


def _flip_bytes(path, at: float = 0.5, count: int = 4) -> None:
    """Invert ``count`` bytes of ``path`` at the fraction ``at`` of its length: damage a format's own
    checks may not see."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i : i + count] = bytes(255 - b for b in data[i : i + count])
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_checkpoint_with_changed_bytes_is_skipped_by_resume_and_predict(
    framework, tmp_path, caplog, tiny_argv, run_of_3_epochs
):
    """Class 2: bytes changed inside the newest checkpoint's largest data file. --resume and predict
    --workdir name the file and both CRC-32s and use the checkpoint before."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    work = run_of_3_epochs(framework, 2, tmp_path / "w")
    argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work)]
    recorded = json.loads((work / "checksums" / "2.json").read_text())["files"]
    name = max(recorded, key=lambda n: recorded[n][0])
    _flip_bytes(work / "checkpoints" / name)
    val_path = tiny_argv[tiny_argv.index("--set") + 3].split("=", 1)[1]
    out = tmp_path / "p.h5"
    predict = __import__(f"{framework}_impl.predict", fromlist=["predict"])
    argv_predict = ["--config", "cpu_tiny", "--workdir", str(work), "--input", val_path, "--out", str(out)]
    res = run_in_process(predict.main, argv_predict)  # in this process: the framework is imported already
    assert res.returncode == 0, res.stderr[-2000:]
    logged = res.stdout + res.stderr
    assert f"{name} is {recorded[name][0]} bytes with CRC-32" in logged and "as recorded at its save" in logged
    assert "using the checkpoint of epoch 1, the newest one that restores" in logged and out.exists()
    with caplog.at_level(logging.WARNING, logger="dlas"):
        res = run_in_process(train.main, [*argv, "--resume"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{name} is {recorded[name][0]} bytes with CRC-32" in caplog.text
    assert "using the checkpoint of epoch 1, the newest one that restores" in caplog.text
    assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_flag_and_a_set_of_one_key_conflict(tiny_argv):
    """Class 9: --num_epochs 2 with --set num_epochs=3 is one error line naming both (equal values pass)."""
    from jax_impl import train

    res = run_in_process(train.main, [*tiny_argv, "--num_epochs", "2", "--set", "num_epochs=3"])
    assert_one_error_line(res, "--num_epochs 2 and --set num_epochs=3 conflict")


def test_a_resume_that_changes_the_recipe_says_what_changed(tiny_cfg, tmp_path, caplog):
    """Class 9: a resume with another learning rate and training file warns with each change, and
    run.json keeps each invocation's own config next to the latest one."""
    from shared_data.core import config as config_mod

    changed = config_mod.replace(tiny_cfg, num_epochs=2, start_lr=0.5, train_path=tiny_cfg.val_path)
    for cfg, start in ((config_mod.replace(tiny_cfg, num_epochs=2), 0), (changed, 1)):
        with caplog.at_level(logging.WARNING, logger="dlas"):
            folder = RunFolder(cfg, tmp_path, "jax", "test", {}, 1)
            EpochReport(folder, 0.0).begin(start, {})
            folder.close()
    line = next(r.getMessage() for r in caplog.records if "changes the run's recipe" in r.getMessage())
    assert line.startswith("this resume changes the run's recipe from epoch 1: start_lr: ")
    assert f"start_lr: {tiny_cfg.start_lr!r} -> 0.5" in line
    assert f"train_path: {tiny_cfg.train_path!r} -> {tiny_cfg.val_path!r}" in line
    assert "num_epochs" not in line
    invocations = json.loads((tmp_path / "run.json").read_text())["invocations"]
    assert [i["config_values"]["start_lr"] for i in invocations] == [tiny_cfg.start_lr, 0.5]


def test_a_key_added_after_a_run_is_a_change_only_away_from_the_kits_base():
    """A run written before ``loss_norm`` existed resumes without a change at the base value (l1),
    with one at l2; a key both invocations hold changes as before."""
    old = {"start_lr": 1e-3}
    base = {"loss_norm": "l1", "start_lr": 2e-4}
    assert records.recipe_changes("quality", old, "quality", {"start_lr": 1e-3, "loss_norm": "l1"}, base) == []
    assert records.recipe_changes("quality", old, "quality", {"start_lr": 1e-3, "loss_norm": "l2"}, base) == [
        "loss_norm: None -> 'l2'"
    ]
    assert records.recipe_changes("a", old, "b", {"start_lr": 2e-4, "loss_norm": "l1"}, base) == [
        "config 'a' -> 'b'",
        "start_lr: 0.001 -> 0.0002",
    ]


@pytest.mark.parametrize(
    ("setting", "texts"),
    [
        ("num_epochs=1000000000000", ("key 'num_epochs': expected at most 1000000, got 1000000000000",)),
        ("Nsamples=1000000000000", ("key 'Nsamples': expected at most 16777216, got 1000000000000",)),
        (
            "num_epochs=1000000",
            ("1000000 epochs of 16 crops in batches of 4 are 4000000 optimizer steps", "at most 1000000"),
        ),
    ],
)
def test_huge_sizes_fail_within_seconds(tmp_path, tiny_argv, setting, texts):
    """Class 4: a size beyond its bound (or a run of more steps than the schedule table allows) is one
    error line before any work, in seconds; nothing is written to the run folder."""
    from jax_impl import train

    t0 = time.monotonic()
    res = run_in_process(train.main, [*tiny_argv, "--set", setting, "--workdir", str(tmp_path / "w")])
    assert time.monotonic() - t0 < 10
    assert_one_error_line(res, *texts)
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_a_nan_in_a_npy_twin_is_named_before_the_run(tiny_cfg, data_dir, tmp_path):
    """Class 3: a NaN in the validation volume and its .npy twin (one without a source record, as the
    tutorial's converter writes them) read by DALI's numpy reader: one error naming the file, voxel
    and channel before the run folder is touched (the HDF5 readers check each crop they read)."""
    import shutil

    import numpy as np

    from shared_data.core import config as config_mod
    from shared_data.core.errors import DatasetError

    for f in data_dir.glob("val_24*"):
        shutil.copy(f, tmp_path / f.name)
    import h5py

    hydro = tmp_path / "val_24_Hydro.npy"
    (tmp_path / "val_24_Hydro.npy.source.json").unlink()
    arr = np.load(hydro)
    arr[23, 5, 7, 1] = np.nan
    np.save(hydro, arr)
    with h5py.File(tmp_path / "val_24.h5", "r+") as f:  # the volume holds the NaN, its twin too
        f["Hydro"][1, 23, 5, 7] = np.nan
    cfg = config_mod.replace(tiny_cfg, val_path=str(tmp_path / "val_24.h5"), data_loader_config="dali-npy")
    with pytest.raises(DatasetError) as err:
        RunFolder(cfg, tmp_path / "w", "jax", "test", {}, 1)
    assert str(err.value).startswith(f"{hydro}: non-finite value nan at voxel (23, 5, 7) channel 1;")
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("flag", "where", "text"),
    [
        ("--workdir", "blocker/run", "blocker is a file, expected a folder"),
        ("--save_weights", "blocker/w.npz", "blocker is a file, expected a folder"),
        ("--save_weights", "folder", "is a folder, expected a file path"),
    ],
)
def test_an_unwritable_output_is_one_line_before_the_first_step(tmp_path, tiny_argv, flag, where, text):
    """Class 5: an output path that cannot be written (under a regular file, which holds for root) or
    that is a folder ends in one line before any training; nothing is trained or written."""
    from jax_impl import train

    (tmp_path / "blocker").write_text("a file")
    (tmp_path / "folder").mkdir()
    argv = [*tiny_argv, "--workdir", str(tmp_path / "w"), flag, str(tmp_path / where)]
    res = run_in_process(train.main, argv)
    assert_one_error_line(res, f"{flag} {tmp_path / where}", text)
    assert not (tmp_path / "w").exists()


def test_predict_out_under_a_file_is_one_line(tmp_path, tiny_argv):
    """Class 5: predict --out under a regular file: one line before the model is built."""
    from jax_impl import predict

    (tmp_path / "blocker").write_text("a file")
    val_path = tiny_argv[tiny_argv.index("--set") + 3].split("=", 1)[1]
    argv = [
        "--config",
        "cpu_tiny",
        "--weights",
        "none.npz",
        "--input",
        val_path,
        "--out",
        str(tmp_path / "blocker/p.h5"),
    ]
    assert_one_error_line(run_in_process(predict.main, argv), "--out", "blocker is a file, expected a folder")


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one(
    framework, tmp_path, tiny_argv, monkeypatch, run_of_3_epochs
):
    """Class 5: ENOSPC injected into the checkpoint save of epoch 2 (after part of it is written): one
    line naming the folder, the reason and the checkpoint kept; --resume then finishes the run."""
    import errno

    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    work = run_of_3_epochs(framework, 1, tmp_path / "w")
    argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work)]
    if framework == "jax":
        import orbax.checkpoint as ocp

        manager = ocp.CheckpointManager
    else:
        import tensorflow as tf

        manager = tf.train.CheckpointManager
    real_save = manager.save

    def full_disk(self, *args, **kwargs):
        (work / "checkpoints" / "partial.tmp").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(manager, "save", full_disk)
    res = run_in_process(train.main, [*argv, "--resume"])
    assert_one_error_line(
        res,
        f"cannot write the checkpoint of epoch 2 in {work / 'checkpoints'} (No space left on device)",
        "the checkpoint of epoch 1 is kept and --resume continues from it",
    )
    (work / "checkpoints" / "partial.tmp").unlink()
    monkeypatch.setattr(manager, "save", real_save)
    assert run_in_process(train.main, [*argv, "--resume"]).returncode == 0
    assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


@pytest.mark.slow
def test_prediction_provenance_is_checked(tiny_cfg, data_dir, tmp_path):
    """Class 8: a prediction records its own Hydro checksum (not the input's) and its input's Nbody
    checksums; validate refuses to score it against another volume of the same size."""
    import h5py
    import numpy as np

    from shared_data.data import dataset, generate
    from shared_data.inference import validate
    from shared_data.model import unet_spec

    from jax_impl import predict

    weights = tmp_path / "w.npz"
    unet_spec.save_weights(weights, unet_spec.init_weights(tiny_cfg, 0))
    other = tmp_path / "other_24.h5"
    assert run_in_process(generate.main, ["--out", str(other), "--size", "24", "--seed", "3"]).returncode == 0
    val, out = data_dir / "val_24.h5", tmp_path / "p.h5"
    argv = ["--config", "cpu_tiny", "--weights", str(weights), "--input", str(val), "--out", str(out)]
    assert run_in_process(predict.main, argv).returncode == 0
    with h5py.File(out) as f, h5py.File(val) as v:
        assert json.loads(f.attrs["Hydro_crc32"]) == dataset.channel_crc32(np.asarray(f["Hydro"]))
        assert json.loads(f.attrs["Hydro_crc32"]) != json.loads(v.attrs["Hydro_crc32"])
    res = run_in_process(validate.main, ["--pred", str(out), "--truth", str(other), "--out", str(tmp_path / "v")])
    assert_one_error_line(res, f"{out} was predicted from {val}", f"differ from {other}'s")
    assert (
        run_in_process(
            validate.main, ["--pred", str(out), "--truth", str(val), "--out", str(tmp_path / "v")]
        ).returncode
        == 0
    )


def test_a_npy_twin_without_a_record_that_differs_in_a_block_is_refused(data_dir, tmp_path):
    """Class 8: a .npy twin without a source record (the tutorial's converter writes none) that differs
    from its HDF5 file in one small block, away from the sampled voxels, is named at its first voxel."""
    import shutil

    import numpy as np

    from shared_data.core.errors import DatasetError
    from shared_data.data import dataset

    for f in data_dir.glob("train_32*"):
        shutil.copy(f, tmp_path / f.name)
    nbody = tmp_path / "train_32_Nbody.npy"
    (tmp_path / "train_32_Nbody.npy.source.json").unlink()
    arr = np.load(nbody)
    sampled = {tuple(int(i) for i in v) for v in dataset.sample_voxels(32)}
    x, y, z = next((x, y, z) for x in range(30, 32) for y in range(32) for z in range(32) if (x, y, z) not in sampled)
    arr[x, y, z, 2] += 0.25
    np.save(nbody, arr)
    info = dataset.validate(tmp_path / "train_32.h5", 4, 5, 16)
    with pytest.raises(DatasetError) as err:
        dataset.check_npy_twins(info, dataset.npy_paths(tmp_path / "train_32.h5"))
    assert f"{nbody} does not match {tmp_path / 'train_32.h5'}: Nbody channel 2 at voxel ({x}, {y}, {z})" in str(
        err.value
    )


def test_inmem_beyond_the_memory_available_says_so_up_front(tiny_cfg, tmp_path, monkeypatch):
    """Class 6: the inmem loader with volumes larger than the memory this process may take (the limit
    injected) is one error naming the bytes needed and available and the loaders that fit."""
    from shared_data.core import config as config_mod

    monkeypatch.setattr(checks, "available_memory_bytes", lambda: 2**20)
    cfg = config_mod.replace(tiny_cfg, data_loader_config="inmem")
    with pytest.raises(UserError) as err:
        RunFolder(cfg, tmp_path / "w", "jax", "test", {}, 1)
    needed = (32**3 + 24**3) * 9 * 4
    assert str(err.value) == (
        f"data_loader_config 'inmem' holds both volumes in host memory: {needed / 2**20:.1f} MiB needed, "
        "1.0 MiB available to this process; use --data_loader_config lowmem (each crop read from the file) or dali-npy"
    )
    assert checks.available_memory_bytes() is None or checks.available_memory_bytes() > 0


def test_available_memory_honours_rlimit_as():
    """Class 6: a ``ulimit -v`` (RLIMIT_AS) is part of the memory a process may take."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY)); "
        "from shared_data.runtime import checks; print(checks.available_memory_bytes())"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert res.returncode == 0, res.stderr
    assert 0 < int(res.stdout) <= 3 * 2**30


def _copy_volume(data_dir, tmp_path, stem: str = "train_32"):
    """A copy of the session's ``stem`` volume and its .npy twins (without their source records, as the
    tutorial's converter writes them) in ``tmp_path``; its checksum attributes dropped, so values can
    be changed in place."""
    import shutil

    import h5py

    for f in data_dir.glob(f"{stem}*"):
        if not f.name.endswith(".source.json"):
            shutil.copy(f, tmp_path / f.name)
    with h5py.File(tmp_path / f"{stem}.h5", "r+") as f:
        for key in ("Nbody_crc32", "Hydro_crc32"):
            del f.attrs[key]
    return tmp_path / f"{stem}.h5"


def _set_value(h5_path, key: str, index: tuple, value: float) -> None:
    """Set ``key``[index] (channel-first) in an HDF5 volume and the same voxel of its DHWC twin."""
    import h5py
    import numpy as np

    from shared_data.data import dataset

    with h5py.File(h5_path, "r+") as f:
        f[key][index] = value
    npy = dataset.npy_paths(h5_path)[key == "Hydro"]
    arr = np.load(npy)
    arr[(*index[1:], index[0])] = value
    np.save(npy, arr)


@pytest.mark.parametrize("loader", ["inmem", "lowmem", "dali-npy", "dali-h5", "device"])
def test_a_value_near_float32s_limit_is_named_before_the_run(tiny_cfg, data_dir, tmp_path, loader):
    """Class 3: 3e38 (finite, but inf once the network or the loss adds to it) in the training volume,
    whatever the loader: one error naming the file, the dataset, channel and voxel before the run
    folder is touched. The scan reads each file once: 0.23 s for a 256^3 HDF5 volume (604 MB, page
    cache, one core) and 0.05 s for its two .npy twins (memory-mapped)."""
    from shared_data.core import config as config_mod
    from shared_data.core.errors import DatasetError
    from shared_data.data import dataset

    train = _copy_volume(data_dir, tmp_path)
    _set_value(train, "Nbody", (1, 3, 4, 5), 3e38)
    cfg = config_mod.replace(tiny_cfg, train_path=str(train), data_loader_config=loader)
    with pytest.raises(DatasetError) as err:
        RunFolder(cfg, tmp_path / "w", "jax", "test", {}, 1)
    if loader == "dali-npy":
        want = f"{dataset.npy_paths(train)[0]}: value 3e+38 beyond +-65504 at voxel (3, 4, 5) channel 1;"
    else:
        want = f"{train}: Nbody channel 1 holds a value 3e+38 beyond +-65504 at voxel (3, 4, 5);"
    assert str(err.value).startswith(want), str(err.value)
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


@pytest.mark.parametrize("framework", ["jax", pytest.param("tf", marks=pytest.mark.slow)])
def test_a_huge_value_in_the_validation_volume_is_one_line(data_dir, tmp_path, tiny_argv, framework):
    """Class 3 end to end: -3e38 in the validation volume ends the trainer in one error line naming
    the file and voxel (not a val_loss of inf, nor "training diverged ... lower start_lr")."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    val = _copy_volume(data_dir, tmp_path, "val_24")
    _set_value(val, "Hydro", (0, 20, 1, 2), -3e38)
    res = run_in_process(train.main, [*tiny_argv, "--set", f"val_path={val}", "--workdir", str(tmp_path / "w")])
    assert_one_error_line(res, f"{val}: Hydro channel 0 holds a value -3e+38 beyond +-65504 at voxel (20, 1, 2)")


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_target_the_loss_cannot_take_is_named_before_the_run(data_dir, tiny_cfg, tmp_path, tiny_argv, framework):
    """Class 3: a target density of 7 (within the value bound; its exp(14 x) in the lambda_rho term
    overflows float32: e^98 > 3.4e38) is outside the model's output range, so the run ends before its
    first step naming the file, channel and value; the check of a diverged step's crops
    (:func:`checks.batch_problem`, for a file changed during the run) names the overflow."""
    import h5py

    from shared_data.core import config as config_mod

    train = _copy_volume(data_dir, tmp_path)
    with h5py.File(train, "r+") as f:
        f["Hydro"][0] = 7.0
    argv = [*tiny_argv, "--set", f"train_path={train}", "--set", "lambda_rho=0.1", "--workdir", str(tmp_path / "w")]
    res = run_in_process(__import__(f"{framework}_impl.train", fromlist=["train"]).main, argv)
    assert_one_error_line(res, f"{train}: Hydro channel 0 holds 7 at voxel (0, 0, 0), outside [-1, 1]")
    assert not (tmp_path / "w" / "metrics.jsonl").exists()
    cfg = config_mod.replace(tiny_cfg, train_path=str(train), lambda_rho=0.1)
    problem = checks.batch_problem(cfg, 0, 0, 1)
    assert f"{train}: Hydro channel 0 (density) holds 7 at voxel (" in problem
    assert "beyond 6.337, where exp(14 x) of the lambda_rho loss term overflows float32" in problem


def test_batch_problem_reads_the_crops_of_the_step(tiny_cfg, data_dir, tmp_path):
    """Class 3: the crops :func:`checks.batch_problem` checks are those of the step (a NaN placed at one
    crop of step 1 of epoch 0 is found there, not at step 0); clean crops give ""."""
    import numpy as np

    from shared_data.core import config as config_mod
    from shared_data.data import host_batches

    train = _copy_volume(data_dir, tmp_path)
    cfg = config_mod.replace(tiny_cfg, train_path=str(train))
    assert checks.batch_problem(cfg, 0, 1, 1) == ""
    plan = host_batches.make_plan(cfg, host_batches.TRAIN, 0, [0], 1, 32)
    inside = lambda v, starts: any(((s <= v) & (v < s + 16)).all() for s in starts)
    steps_with = lambda v: [i for i, d in enumerate(plan.draws) if inside(v, d.starts)]
    voxel = next(
        (x, y, z) for x in range(32) for y in range(32) for z in range(32) if steps_with(np.array([x, y, z])) == [1]
    )
    _set_value(train, "Nbody", (2, *voxel), np.nan)
    assert checks.batch_problem(cfg, 0, 0, 1) == ""
    problem = checks.batch_problem(cfg, 0, 1, 1)
    assert f"{train} Nbody crop at (" in problem and ": non-finite value nan at index (2, " in problem
    assert checks.batch_problem(config_mod.replace(cfg, data_loader_config="synthetic"), 0, 1, 1) is None


def test_an_early_error_closes_orbaxs_checkpoint_manager(tmp_path, tiny_argv, monkeypatch):
    """Class 5: a JAX run that ends in a clean early error (here: a folder that holds a checkpoint,
    without --resume) closes orbax's CheckpointManager before it returns, so no orbax thread is left
    to print "cannot schedule new futures after interpreter shutdown" at exit."""
    import orbax.checkpoint as ocp

    from jax_impl import train

    closed = []
    real_close = ocp.CheckpointManager.close
    monkeypatch.setattr(ocp.CheckpointManager, "close", lambda self: closed.append(self) or real_close(self))
    work = tmp_path / "w"
    (work / "checkpoints" / "1").mkdir(parents=True)
    res = run_in_process(train.main, [*tiny_argv, "--workdir", str(work)])
    assert_one_error_line(res, f"{work} already holds checkpoints (epoch 1); pass --resume")
    assert len(closed) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("framework", "record", "lost"),
    [
        ("jax", "metrics.jsonl", ": epoch 2 is not checkpointed"),
        ("jax", "out.log", ""),
        ("tf", "metrics.jsonl", ": epoch 2 is not checkpointed"),
    ],
)
def test_a_full_disk_during_a_log_write_keeps_the_last_checkpoint(
    framework, record, lost, tmp_path, tiny_argv, monkeypatch, run_of_3_epochs
):
    """Class 5: ENOSPC injected into the write of metrics.jsonl (after a torn part of the line) or of
    out.log (every write of the resumed run): one line naming the file, the reason and the checkpoint
    kept, instead of a traceback (metrics.jsonl) or logging's traceback on stderr for every line and
    exit 0 (out.log); once there is room, --resume finishes the run with one record per epoch."""
    import errno
    import io

    from shared_data.runtime import records

    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    work = run_of_3_epochs(framework, 1, tmp_path / "w")
    argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work)]
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    if record == "metrics.jsonl":

        def append(self, _):
            with open(self.path, "a") as fh:
                fh.write('{"epoch": 2, "st')
            raise full

        monkeypatch.setattr(records.MetricsLog, "append", append)
    else:

        class FullDisk(io.StringIO):
            def write(self, _):
                raise full

        monkeypatch.setattr(logging.FileHandler, "_open", lambda self: FullDisk())
    res = run_in_process(train.main, [*argv, "--resume"])
    assert_one_error_line(
        res,
        f"cannot write {work / record} (No space left on device){lost}; "
        "the checkpoint of epoch 1 is kept and --resume continues from it",
    )
    assert "Logging error" not in res.stdout
    assert checkpoint_epochs(work / "checkpoints") == [1]
    monkeypatch.undo()
    assert run_in_process(train.main, [*argv, "--resume"]).returncode == 0
    assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def _main_of(module: str):
    return __import__(module, fromlist=["main"]).main


@pytest.mark.parametrize(
    ("command", "args", "texts"),
    [
        ("shared_data.data.generate", ["--out", "blocker/g.h5"], ["--out {t}/blocker/g.h5: {t}/blocker is a file"]),
        ("shared_data.data.generate", ["--out", "folder"], ["--out {t}/folder is a folder, expected a file path"]),
        ("shared_data.data.convert", ["v.h5"], ["output {t}/v_Hydro.npy is a folder, expected a file path"]),
        ("jax_impl.export", ["--out", "blocker/e"], ["--out {t}/blocker/e: {t}/blocker is a file, expected a folder"]),
        ("jax_impl.export", ["--out", "blocker"], ["--out {t}/blocker is a file, expected a folder"]),
    ],
)
def test_generate_convert_and_export_outputs_that_cannot_be_written(data_dir, tmp_path, command, args, texts):
    """Class 5: an output under a regular file (which holds for root) or where a folder is in the way
    ends in one line before any work (generate does not simulate first), and nothing is written."""
    import shutil

    from shared_data.model import unet_spec

    (tmp_path / "blocker").write_text("a file")
    (tmp_path / "folder").mkdir()
    shutil.copy(data_dir / "val_24.h5", tmp_path / "v.h5")
    (tmp_path / "v_Hydro.npy").mkdir()
    if command.endswith("export"):
        cfg = __import__("shared_data.core.config", fromlist=["load_config"]).load_config("cpu_tiny")
        unet_spec.save_weights(tmp_path / "w.npz", unet_spec.init_weights(cfg, 0))
        args = ["--config", "cpu_tiny", "--weights", str(tmp_path / "w.npz"), *args]
    before = sorted(p.name for p in tmp_path.iterdir())
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = run_in_process(_main_of(command), [*args, "--size", "16"] if "generate" in command else args)
    finally:
        os.chdir(old)
    assert_one_error_line(res, *(t.format(t=tmp_path) for t in texts))
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_full_disk_during_convert_or_predict_leaves_no_partial_file(data_dir, tmp_path, monkeypatch):
    """Class 5: ENOSPC while convert writes a .npy twin, or halfway through predict's HDF5 output
    (built in memory, written as bytes): one line naming the file and the reason; no partial
    output (or temporary file) is left."""
    import errno
    import shutil
    from pathlib import Path

    import numpy as np

    from shared_data.core.config import load_config
    from shared_data.data import convert
    from shared_data.model import unet_spec

    from jax_impl import predict

    shutil.copy(data_dir / "val_24.h5", tmp_path / "v.h5")
    unet_spec.save_weights(tmp_path / "w.npz", unet_spec.init_weights(load_config("cpu_tiny"), 0))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np.lib.format, "open_memmap", full)
    res = run_in_process(convert.main, [str(tmp_path / "v.h5")])
    assert_one_error_line(res, f"cannot write {tmp_path / 'v_Nbody.npy'} (No space left on device)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.h5", "w.npz"]

    real_write = Path.write_bytes

    def half_written(self, data):  # the disk fills halfway through the file
        real_write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", half_written)  # predict builds the HDF5 file in memory
    argv = ["--config", "cpu_tiny", "--weights", str(tmp_path / "w.npz"), "--input", str(tmp_path / "v.h5")]
    res = run_in_process(predict.main, [*argv, "--out", str(tmp_path / "p.h5")])
    assert_one_error_line(res, f"cannot write {tmp_path / 'p.h5'} (No space left on device)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.h5", "w.npz"]


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stopped_reconvert_keeps_the_earlier_twins(data_dir, tmp_path, monkeypatch, signum):
    """A signal while convert rewrites valid twins, the Nbody twin already written to its temporary file
    and the Hydro twin half read: one line, exit code 128 + the signal, the earlier twins and records
    byte for byte as they were, no temporary file left."""
    import shutil
    import signal

    from shared_data.data import convert, dataset

    shutil.copy(data_dir / "val_24.h5", tmp_path / "v.h5")
    convert.convert_to_npy(tmp_path / "v.h5")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    reading = dataset.reading

    def signalled(path, what):
        if what.startswith("Hydro (x from 16)"):
            signal.raise_signal(getattr(signal, signum))
        return reading(path, what)

    monkeypatch.setattr(dataset, "reading", signalled)
    monkeypatch.setattr(convert, "SLAB", 8)
    res = run_in_process(convert.main, [str(tmp_path / "v.h5")])
    assert res.returncode == 128 + getattr(signal, signum), res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"stopped by {signum}: the .npy twins"), res.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handlers are undone


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stop_once_the_new_twins_replace_the_old_waits_for_their_records(data_dir, tmp_path, monkeypatch, signum):
    """A signal after the new twins have replaced the earlier ones, while their records are written: the
    stop waits until the set is complete (a stop there removed the new and the earlier twins alike):
    one line naming the file whose twins are whole, exit code 128 + the signal, and the twins and
    records match the source."""
    import shutil
    import signal

    from shared_data.data import convert, dataset

    shutil.copy(data_dir / "val_24.h5", tmp_path / "v.h5")
    convert.convert_to_npy(tmp_path / "v.h5")
    record = dataset.write_source_record
    signalled = []

    def record_with_a_signal(out, path):
        if not signalled:
            signalled.append(out)
            signal.raise_signal(getattr(signal, signum))
        return record(out, path)

    monkeypatch.setattr(dataset, "write_source_record", record_with_a_signal)
    res = run_in_process(convert.main, [str(tmp_path / "v.h5")])
    monkeypatch.setattr(dataset, "write_source_record", record)
    assert res.returncode == 128 + getattr(signal, signum) and signalled, res
    lines = res.stderr.strip().splitlines()
    assert lines == [
        f"stopped by {signum}: the .npy twins of {tmp_path / 'v.h5'} are written whole, with their records "
        "(the files converted before it are whole)"
    ], res.stderr
    twins = dataset.npy_paths(tmp_path / "v.h5")
    assert all(p.exists() and dataset.source_record(p).exists() for p in twins)
    dataset.check_npy_twins(dataset.validate(tmp_path / "v.h5", 4, 5), twins)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file


def test_a_stop_while_convert_imports_is_one_sentence(data_dir, tmp_path):
    """SIGTERM while ``python -m shared_data.data.convert`` imports numpy (made to take 60 s here): one
    sentence, exit code 143, within seconds, no traceback, nothing written."""
    import shutil

    slow = tmp_path / "slow" / "numpy"
    slow.mkdir(parents=True)
    (slow / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    shutil.copy(data_dir / "val_24.h5", tmp_path / "v.h5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "slow"), str(REPO_ROOT)])}
    cmd = [sys.executable, "-m", "shared_data.data.convert", str(tmp_path / "v.h5")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the guard is in place once SIGTERM is caught (SigCgt)
            if signal.SIGTERM in launch.status_signals(proc.pid, "SigCgt"):
                break
            time.sleep(0.05)
        time.sleep(0.5)  # inside the 60-s import
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, out, err) == (143, "", "stopped by SIGTERM: nothing was being converted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow", "v.h5"]


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("jax_impl.predict", ["--input", "{val}", "--out", "{t}/p.h5"]),
        ("jax_impl.export", ["--out", "{t}/e"]),
        pytest.param("tf_impl.predict", ["--input", "{val}", "--out", "{t}/p.h5"], marks=pytest.mark.slow),
    ],
)
def test_a_truncated_weights_file_is_one_line(data_dir, tmp_path, command, flags):
    """Class 5: a weights .npz cut short (a copy interrupted, a full disk at its write) given to
    predict or export: one line naming the file, nothing written."""
    from shared_data.core.config import load_config
    from shared_data.model import unet_spec

    whole = tmp_path / "whole.npz"
    unet_spec.save_weights(whole, unet_spec.init_weights(load_config("cpu_tiny"), 0))
    cut = tmp_path / "cut.npz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    argv = ["--config", "cpu_tiny", "--weights", str(cut)]
    argv += [f.format(t=tmp_path, val=data_dir / "val_24.h5") for f in flags]
    res = run_in_process(_main_of(command), argv)
    assert_one_error_line(res, f"weights file {cut} is damaged (truncated?) or not a canonical .npz weights file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.npz", "whole.npz"]


def _fill(folder, leave: int) -> None:
    """Fill the file system of ``folder`` with a file ``fill`` so that ``leave`` bytes stay free."""
    st = os.statvfs(folder)
    (folder / "fill").write_bytes(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_real_full_disk_loses_nothing(framework, tmp_path, tiny_argv):
    """Class 5 on a real full file system (an 8 MiB tmpfs; root only, skipped where mounting is not
    allowed): with 8 KiB left a resume stops at its first record (the lock, out.log or run.json),
    with 48 KiB left at the checkpoint of epoch 2 (orbax's tensorstore and TF report a full disk in
    their own errors); each is one line, no traceback at exit (so these two run as processes), and
    once there is room --resume finishes the run (the first epoch and that resume run in this
    process, which has the framework imported)."""
    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        work = small / "w"
        argv = [*tiny_argv, "--num_epochs", "2", "--workdir", str(work)]
        train = __import__(f"{framework}_impl.train", fromlist=["train"])
        assert run_in_process(train.main, [*argv, "--stop_after_epoch", "1"]).returncode == 0
        _fill(small, 8 << 10)
        assert_one_error_line(run_module(f"{framework}_impl.train", *argv, "--resume"), "(No space left on device)")
        (small / "fill").unlink()
        _fill(small, 48 << 10)
        assert_one_error_line(
            run_module(f"{framework}_impl.train", *argv, "--resume"),
            f"cannot write the checkpoint of epoch 2 in {work / 'checkpoints'} (No space left on device); "
            "the checkpoint of epoch 1 is kept and --resume continues from it",
        )
        assert checkpoint_epochs(work / "checkpoints") == [1]
        partial = [p.name for p in (work / "checkpoints").iterdir() if "tmp" in p.name or "temp" in p.name]
        assert not partial  # the failed save's own files (orbax's N.orbax-checkpoint-tmp, TF's ckpt-N_temp)
        (small / "fill").unlink()
        res = run_in_process(train.main, [*argv, "--resume"])
        assert res.returncode == 0, res.stderr[-2000:]
        assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    finally:
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_kill_9_during_asynchronous_writes_then_a_resume_ends_as_the_uninterrupted_run(framework, tmp_path, tiny_argv):
    """kill -9 while the checkpoint of epoch 1 is written in the background, then, resumed, while that
    of epoch 2 is (the background half held open: ``processes.hold_save``), then a last ``--resume``:
    the run ends with the per-epoch losses of an uninterrupted run, bit for bit, and a complete
    checkpoint of every epoch."""
    argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--num_devices", "1"]
    straight = run_module(f"{framework}_impl.train", *argv, "--workdir", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    work = tmp_path / "killed"
    for epoch, resume in ((1, []), (2, ["--resume"])):
        held = tmp_path / f"held_{epoch}"
        cmd = [*SIGNAL_AT, "-1", f"hold-save:{epoch}:{held}", "-m", f"{framework}_impl.train", *argv]
        proc = subprocess.Popen(
            [*cmd, "--workdir", str(work), *resume],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        _until_created(held, proc)
        assert held.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "no save held in 300 s"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
    res = run_module(f"{framework}_impl.train", *argv, "--workdir", str(work), "--resume")
    assert res.returncode == 0, res.stderr[-2000:]
    losses = [(h["epoch"], h["train_loss"], h["val_loss"]) for h in records.read_metrics(work)]
    assert losses == [(h["epoch"], h["train_loss"], h["val_loss"]) for h in records.read_metrics(tmp_path / "straight")]
    assert checkpoint_epochs(work / "checkpoints") == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_sigterm_during_the_last_asynchronous_save_waits_for_it(framework, tmp_path, tiny_argv):
    """SIGTERM while the last epoch's checkpoint is written in the background: the process waits for
    the write before it exits, its stop line says nothing is lost, the checkpoint is complete (its
    checksums recorded) and a resume has nothing left to train."""
    argv = [*tiny_argv, "--num_epochs", "2", "--num_devices", "1", "--workdir", str(tmp_path / "w")]
    held = tmp_path / "held"
    proc = subprocess.Popen(
        [*SIGNAL_AT, "-1", f"hold-save:2:{held}", "-m", f"{framework}_impl.train", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    _until_created(held, proc)
    assert held.exists(), "no save held"
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # still waiting for the write
    held.with_name("held.release").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("stopped by SIGTERM between epochs: nothing is lost"), err[-2000:]
    assert checkpoint_epochs(tmp_path / "w" / "checkpoints")[-1] == 2
    assert (tmp_path / "w" / "checksums" / "2.json").is_file()
    res = run_module(f"{framework}_impl.train", *argv, "--resume")
    assert res.returncode == 0 and [h["epoch"] for h in records.read_metrics(tmp_path / "w")] == [1, 2], res.stderr
