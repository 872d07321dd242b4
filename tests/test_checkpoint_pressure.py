"""A checkpoint save under pressure: a real full file system (a small tmpfs) and a real memory limit
(``RLIMIT_AS``, what ``ulimit -v`` sets) each end in the run's one line, with the last checkpoint
kept: no traceback of orbax's background threads, no "can't start new thread", no hang, no native
abort. Memory that runs out elsewhere is one line too (:func:`shared_data.core.errors.out_of_memory`)."""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import assert_one_error_line

from shared_data.core import errors
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError, run_cli
from shared_data.runtime import checks, memory


@contextlib.contextmanager
def small_filesystem(folder, size: str):
    """A tmpfs of ``size`` mounted on ``folder`` (root only); skips the test with the reason elsewhere."""
    folder.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(logging.Formatter().format(record))


@pytest.mark.parametrize("leave_kib", [16, 100])
def test_orbax_reports_of_a_full_disk_stay_behind_the_runs_line(tmp_path, leave_kib):
    """The checkpoint of epoch 2 on a file system with ``leave_kib`` KiB free: the save ends in the run's
    one line and orbax's own reports (an ERROR record with a traceback from each of its threads,
    asyncio's "Future exception was never retrieved") reach no log handler."""
    import jax.numpy as jnp

    from jax_impl.checkpoints import Checkpoints

    noise = np.random.default_rng(0).standard_normal((4, 256, 256), np.float32)  # 1 MiB that does not compress
    state = {f"w{i}": jnp.asarray(noise[i]) for i in range(4)}
    records = _Records()
    logging.getLogger().addHandler(records)
    try:
        with small_filesystem(tmp_path / "small", "4m") as small, Checkpoints(small / "ckpt", 2, state) as ckpt:
            ckpt.save(1, state)
            ckpt.wait()
            st = os.statvfs(small)
            (small / "fill").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - (leave_kib << 10)))
            ckpt.save(2, state)  # returns with the arrays on the host; the write fails in the background
            with pytest.raises(UserError) as failed:
                ckpt.wait()
            assert ckpt.epochs() == [1]
            gc.collect()  # orbax's unread futures are reported when they are freed
    finally:
        logging.getLogger().removeHandler(records)
    assert str(failed.value) == (
        f"cannot write the checkpoint of epoch 2 in {small / 'ckpt'} (No space left on device); "
        "the checkpoint of epoch 1 is kept and --resume continues from it"
    )
    assert not [line for line in records.lines if "Traceback" in line or "RESOURCE_EXHAUSTED" in line], records.lines


def test_a_failed_saves_folder_written_again_late_is_removed(tmp_path):
    """After a failed save, a write that ends 0.2 s after the first removal (TensorStore's, on its own
    thread) creates the save's temporary folder again: the sweep at close removes it as well, and
    leaves the finished checkpoint alone."""
    from jax_impl.checkpoint_quirks import remove_late_partial_saves

    (tmp_path / "1").mkdir()
    partial = tmp_path / "2.orbax-checkpoint-tmp-1700000000"
    (partial / "d").mkdir(parents=True)

    def late_write():
        time.sleep(0.2)
        (partial / "d").mkdir(parents=True)
        (partial / "d" / "chunk").write_bytes(b"\0" * 64)

    writer = threading.Thread(target=late_write)
    writer.start()
    remove_late_partial_saves(tmp_path)
    writer.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]


#: Saves the checkpoint of epoch 1 of ``cpu_tiny`` through the trainers' ``Run.saving`` after lowering
#: this process's RLIMIT_AS to its size plus ``margin`` MiB (argv: framework, run folder, margin, data).
SAVE_UNDER_A_LIMIT = """
import resource, sys
from pathlib import Path
from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli
from shared_data.runtime import saves
from shared_data.runtime.run_folder import RunFolder

framework, work, margin, data = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
cfg = config_mod.load_config(
    "cpu_tiny", overrides=dict(train_path=str(data / "train_32.h5"), val_path=str(data / "val_24.h5"))
)

def main(_):
    folder = RunFolder(cfg, work, framework, "test", {}, 1)
    if framework == "jax":
        from jax_impl import model
        from jax_impl.checkpoints import Checkpoints

        state = model.init_params(cfg, 0)
        ckpt, save = Checkpoints(work / "checkpoints", 2, state), lambda: ckpt.save(1, state)
    else:
        from tf_impl import model
        from tf_impl.checkpoints import Checkpoints

        from tf_impl.step import TrainState

        ckpt = Checkpoints(work / "checkpoints", 2, TrainState(model.build_model(cfg)))
        save = lambda: ckpt.save(1)
    size = next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]
    resource.setrlimit(resource.RLIMIT_AS, (int(size) * 1024 + margin * 2**20, resource.RLIM_INFINITY))
    with ckpt:
        with saves.saving(folder, 1, ckpt):
            save()
        saves.written(folder, ckpt)
    print("saved", ckpt.epochs())

raise SystemExit(run_cli(main))
"""


@pytest.mark.parametrize(
    "framework, headroom",
    [("jax", "short"), ("jax", "enough"), ("tf", "short"), pytest.param("tf", "enough", marks=pytest.mark.slow)],
)
def test_a_checkpoint_save_under_a_memory_limit(framework, headroom, tmp_path, data_dir):
    """``ulimit -v`` leaving 128 MiB for the save: refused before orbax or TensorFlow start it, in one
    line naming the memory needed and the limit (the save hung in orbax's thread start, printed "can't
    start new thread", or TensorFlow aborted natively); leaving what the check asks for (plus 96 MiB:
    a thread that the checkpointer starts before the check may take a malloc arena of 64 MiB),
    the save is written."""
    from shared_data.core import config as config_mod

    need = checks.save_memory_needed(config_mod.load_config("cpu_tiny")) >> 20 if headroom == "enough" else 0
    margin = 128 if headroom == "short" else need + 96  # short: under the need, room for the rest
    args = [framework, str(tmp_path / "w"), str(margin), str(data_dir)]
    res = subprocess.run(
        [sys.executable, "-c", SAVE_UNDER_A_LIMIT, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    if headroom == "enough":
        assert res.returncode == 0 and "saved [1]" in res.stdout, (res.returncode, res.stderr[-3000:])
        return
    assert_one_error_line(
        res,
        "cannot save the checkpoint of epoch 1: it needs about ",
        "more memory and this process may map ",
        "no epoch is checkpointed, so the run starts again from scratch",
    )
    # The headroom is measured at the check, after the framework's own threads may have mapped some of
    # the 128 MiB: positive and at most the margin.
    headroom = float(re.search(r"may map ([0-9.]+) MiB more \(ulimit -v ", res.stderr).group(1))
    assert 0 < headroom <= 128, res.stderr[-2000:]
    assert "Traceback" not in res.stdout, res.stdout[-3000:]


def under_ulimit(limit_mib: int) -> list[str]:
    """This interpreter started by a shell under ``ulimit -v`` of ``limit_mib`` MiB, as a user sets it
    (arguments follow); no ``preexec_fn``, which forks this multithreaded process."""
    return ["bash", "-c", f'ulimit -v {limit_mib << 10} && exec "$0" "$@"', sys.executable]


@pytest.mark.parametrize("framework, limit_mib", [("jax", 800), ("tf", 1600)])
def test_a_trainer_under_a_tight_ulimit_refuses_before_compiling(framework, limit_mib, tmp_path, data_dir):
    """``ulimit -v`` from the start, above what the framework's import maps but short of what compiling
    and the first save take (TensorFlow aborted natively there: ``std::bad_alloc`` or LLVM's "Unable
    to allocate section memory"): one line naming the limit, what is left and what is needed, exit
    code 2, no run folder."""
    work = tmp_path / "w"
    data = [f"--set=train_path={data_dir / 'train_32.h5'}", f"--set=val_path={data_dir / 'val_24.h5'}"]
    res = subprocess.run(
        [*under_ulimit(limit_mib), "-m", f"{framework}_impl.train", "--config=cpu_tiny", f"--workdir={work}", *data],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    name = {"jax": "JAX", "tf": "TensorFlow"}[framework]
    assert_one_error_line(
        res,
        f"cannot train under ulimit -v {memory.format_bytes(limit_mib << 20)}: after {name} loaded this process ",
        " may map ",
        "and compiling, training and the first checkpoint save take about ",
        "or more (nothing is trained)",
    )
    numbers = r"may map ([0-9.]+) MiB more, .* take about ([0-9.]+) MiB; raise the limit by ([0-9.]+) MiB"
    left, need, short = (float(x) for x in re.search(numbers, res.stderr).groups())
    assert need == pytest.approx((memory.TRAIN_RESERVE_BYTES + checks.save_memory_needed(_tiny())) / 2**20, abs=0.05)
    assert 0 < left < need and short == pytest.approx(need - left, abs=0.15)
    assert not work.exists()


@pytest.mark.parametrize(
    "framework, command, limit_mib",
    [("jax", "predict", 700), ("tf", "predict", 1450), ("jax", "export", 650), ("tf", "export", 1400)],
)
def test_predict_and_export_under_a_tight_ulimit_refuse_before_restoring(
    framework, command, limit_mib, tmp_path, data_dir
):
    """``ulimit -v`` from the start, above the framework's import but short of what restoring, compiling
    and predicting (or tracing) take: TensorFlow crashed natively there (rc 134 or 139) and JAX's
    restore failed as a "damaged" checkpoint; now one line with the limit and the need, nothing
    written."""
    from shared_data.model import unet_spec

    weights = tmp_path / "w.npz"
    unet_spec.save_weights(weights, unet_spec.init_weights(_tiny(), 0))
    out = tmp_path / ("pred.h5" if command == "predict" else "export")
    args = ["--input", str(data_dir / "val_24.h5")] if command == "predict" else []

    res = subprocess.run(
        [*under_ulimit(limit_mib), "-m", f"{framework}_impl.{command}", "--config=cpu_tiny", f"--weights={weights}",
         *args, f"--out={out}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )  # fmt: skip
    reserve = memory.PREDICT_RESERVE_BYTES if command == "predict" else memory.EXPORT_RESERVE_BYTES
    need = reserve + (4 * 5 * 24**3 if command == "predict" else 0)  # the float32 prediction: 5 channels, 24^3
    assert_one_error_line(
        res,
        f"cannot {command} under ulimit -v {memory.format_bytes(limit_mib << 20)}: after ",
        f" take about {memory.format_bytes(need)}; raise the limit by ",
        "or more (nothing is written)",
    )
    assert not out.exists()


def test_a_restore_that_runs_out_of_memory_is_not_called_damaged(tmp_path):
    """A checkpoint whose files match their checksums but whose restore fails because a thread could not
    start (TensorStore wraps it in an error of its own) is reported as memory, not as a damaged
    checkpoint; another error still names the checkpoint as damaged."""
    import jax.numpy as jnp

    from jax_impl.checkpoints import Checkpoints

    state = {"w": jnp.ones((4, 4))}
    with Checkpoints(tmp_path / "ckpt", 2, state) as ckpt:
        ckpt.save(1, state)

        def fails(cause):
            def restore(*_, **__):
                try:
                    raise cause
                except Exception as inner:
                    raise Exception("Encountered error while reading array index: (slice(0, 4, 1),)") from inner

            return restore

        ckpt.manager.restore = fails(RuntimeError("can't start new thread"))
        with pytest.raises(UserError) as memory_err:
            ckpt.restore(1)
        ckpt.manager.restore = fails(ValueError("bad chunk"))
        with pytest.raises(UserError) as damaged:
            ckpt.restore(1)
    assert str(memory_err.value).startswith(
        f"cannot restore checkpoint {tmp_path / 'ckpt'}/1 (its files match their checksums), out of memory: "
        "a thread could not start (no memory for its stack)"
    )
    assert str(damaged.value) == (
        f"checkpoint {tmp_path / 'ckpt'}/1 is damaged (Encountered error while reading array index: "
        "(slice(0, 4, 1),)); use another --workdir or --overwrite"
    )


def test_out_of_memory_in_walks_the_chain():
    """The first memory error in ``__cause__`` / ``__context__`` is found; a chain without one is None."""
    try:
        try:
            raise MemoryError("Unable to allocate 8.00 GiB for an array with shape (1024, 1024, 1024)")
        except MemoryError as inner:
            raise RuntimeError("reading failed") from inner
    except RuntimeError as err:
        chained = err
    assert errors.out_of_memory_in(chained).startswith(
        "out of memory: Unable to allocate 8.00 GiB for an array with shape (1024, 1024, 1024)"
    )
    assert errors.out_of_memory_in(ValueError("x")) is None


def _tiny():
    from shared_data.core import config as config_mod

    return config_mod.load_config("cpu_tiny")


def _raises(err):
    def main(_):
        raise err

    return main


@pytest.mark.parametrize(
    "err, what",
    [
        (
            MemoryError("Unable to allocate 1.00 GiB for an array with shape (268435456,) and data type float32"),
            "Unable",
        ),
        (RuntimeError("can't start new thread"), "a thread could not start (no memory for its stack)"),
        (OSError(errno.ENOMEM, os.strerror(errno.ENOMEM)), "Cannot allocate memory"),
        (ImportError("libjax_common.so: failed to map segment from shared object"), "libjax_common.so could not be"),
    ],
)
def test_memory_that_runs_out_anywhere_is_one_line(err, what, capsys):
    """Out of memory outside a save (an array, a loader's shared memory, a thread, a library at
    import): one line naming what could not be allocated and the process's limit."""
    import resource

    assert run_cli(_raises(err), []) == 2
    line = capsys.readouterr().err
    assert line.startswith(f"error: out of memory: {what}") and line.count("\n") == 1, line
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    assert line.endswith("the host has no more to give\n" if soft == resource.RLIM_INFINITY else "(ulimit -v)\n")
    assert errors.out_of_memory(ValueError("other")) is None


def test_memory_that_runs_out_names_the_kits_frame_that_asked():
    try:
        raise MemoryError("Unable to allocate 8.00 EiB")
    except MemoryError as err:
        assert errors.out_of_memory(err).startswith(
            "out of memory: Unable to allocate 8.00 EiB at tests/test_checkpoint_pressure.py:"
        )


def test_a_closed_event_loop_reported_by_a_native_thread_is_dropped(monkeypatch):
    """tensorstore's late write callbacks into orbax's closed event loop reach ``sys.excepthook``
    through ``PyErr_Print`` (a native thread) or ``sys.unraisablehook``: the save's hooks drop "Event
    loop is closed" in both, and every other exception is still printed. The hooks are the save's
    alone: the process's own come back after a save, and stay replaced only after a failed one."""
    from jax_impl import checkpoint_quirks

    printed, unraisable = [], []
    monkeypatch.setattr(sys, "excepthook", lambda t, e, tb: printed.append(e))
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))
    before = sys.excepthook, sys.unraisablehook
    with checkpoint_quirks.ClosedLoopQuiet():
        assert (sys.excepthook, sys.unraisablehook) != before
    assert (sys.excepthook, sys.unraisablehook) == before  # a save that went well leaves nothing behind
    with checkpoint_quirks.ClosedLoopQuiet() as quiet:
        quiet.keep = True  # a failed save
    hook = sys.excepthook
    hook(RuntimeError, RuntimeError("Event loop is closed"), None)
    other = RuntimeError("Event loop is closing")
    hook(RuntimeError, other, None)
    hook(ValueError, ValueError("Event loop is closed"), None)
    assert [str(e) for e in printed] == ["Event loop is closing", "Event loop is closed"]
    assert printed[0] is other and isinstance(printed[1], ValueError)

    class Report:
        def __init__(self, exc):
            self.exc_value = exc

    sys.unraisablehook(Report(RuntimeError("Event loop is closed")))
    sys.unraisablehook(Report(other))
    assert unraisable == [other]
