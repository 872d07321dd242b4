"""Shared fixtures (tiny generated dataset files and the tiny config that points at them) and helpers
(commands run in a fresh interpreter or in this one, the one-error-line check, relative error)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from processes import at_batch, cpu_xla_flags, send

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_FLAGS", cpu_xla_flags(2))  # 2 CPU devices for JAX sharding tests

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.core.errors import run_cli
from shared_data.data import generate

REPO_ROOT = config_mod.REPO_ROOT
#: The fields every benchmark record has (dlas_compare.benchmark_timing.run_bench), ladder rungs' included.
BENCHMARK_KEYS = {
    "label",
    "framework",
    "mode",
    "config",
    "loader",
    "precision",
    "global_batch",
    "samples_per_sec",
    "samples_per_sec_min",
    "samples_per_sec_max",
    "step_ms_p50",
    "step_ms_p90",
    "compile_sec",
    "mfu",
    "peak_tflops",
    "mfu_of_measured_matmul",
    "peak_memory_gib",
    "device",
    "versions",
    "command",
    "date",
    "config_values",
}


def run_module(*args: str, timeout: float = 600, cwd=REPO_ROOT, **kwargs) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in a fresh interpreter, from the checkout's root unless ``cwd``: what a user runs."""
    cmd = [sys.executable, "-m", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, **kwargs)


@dataclasses.dataclass
class Outcome:
    """What a command run in this process left: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def run_in_process(main, argv) -> Outcome:
    """A command's ``main(argv)`` run as its console script runs it (``run_cli``), in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_cli(main, argv)
        except SystemExit as exit_:  # argparse's own errors and --help
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    return Outcome(code, out.getvalue(), err.getvalue())


def assert_one_error_line(res, *texts: str) -> None:
    """Exit code 2, no traceback, and one ``error:`` line on stderr that holds every one of ``texts``."""
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and all(t in lines[0] for t in texts), res.stderr[-2000:]


def checkpoint_epochs(folder) -> list[int]:
    """The epochs with a finished checkpoint in ``folder``: orbax's ``N`` folders, TF's ``ckpt-N.index``."""
    jax_epochs = [int(p.name) for p in Path(folder).glob("*") if p.name.isdigit()]
    return sorted(jax_epochs + [int(p.name[5:-6]) for p in Path(folder).glob("ckpt-*.index")])


def process_ended(pid: int, within: float = 5.0) -> bool:
    """Process ``pid`` has ended within ``within`` seconds (a zombie that no one reaps counts)."""
    t_end = time.monotonic() + within
    while time.monotonic() < t_end:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def read_tensorboard(logdir) -> tuple[dict[str, list[tuple[int, float]]], dict]:
    """The scalars (tag -> [(step, value)]) and the hparams (name -> value) of the event files in
    ``logdir``, read back as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    scalars: dict[str, list[tuple[int, float]]] = {}
    hparams: dict = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for event in map(Event.FromString, RawEventFileLoader(str(path)).Load()):
            for value in event.summary.value:
                if value.tag == "_hparams_/session_start_info":
                    data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
                    for name, v in data.session_start_info.hparams.items():
                        hparams[name] = getattr(v, v.WhichOneof("kind"))
                elif value.WhichOneof("value") == "simple_value":
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars, hparams


def assert_tensorboard_record(logdir, framework: str, cfg, hist: list[dict]) -> None:
    """The event files of a fresh run of ``cfg`` hold the tutorial's tags at every epoch's step (and
    step 0), equal to ``metrics.jsonl``'s ``hist``, and the config as hparams."""
    scalars, hparams = read_tensorboard(logdir)
    steps = hist[-1]["step"] // len(hist)
    assert set(scalars) == {"Loss/train", "Loss/valid", "Learning Rate", "Avg iters per sec"}
    assert [s for s, _ in scalars["Loss/valid"]] == [steps * i for i in range(len(hist) + 1)]
    assert scalars["Loss/valid"][-1][1] == pytest.approx(hist[-1]["val_loss"], rel=1e-6)
    assert scalars["Learning Rate"][-1][1] == pytest.approx(hist[-1]["lr"], rel=1e-6)
    assert hparams["framework"] == framework and hparams["start_lr"] == pytest.approx(cfg.start_lr)
    assert hparams["Nsamples"] == cfg.Nsamples and hparams["num_epochs"] == cfg.num_epochs
    assert hparams["global_batch"] == cfg.Nsamples // steps
    assert hparams["data_loader_config"] == cfg.data_loader_config and hparams["enable_jit"] is cfg.enable_jit


def _generate(path, size, seed):
    args = generate.build_parser().parse_args(
        ["--out", str(path), "--size", str(size), "--seed", str(seed), "--chunk", "16"]
    )
    args.box = 0.25 * size
    generate.generate(args)
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A folder with train_32.h5 (32^3, seed 1) and val_24.h5 (24^3, seed 2) and their .npy files."""
    d = tmp_path_factory.mktemp("data")
    _generate(d / "train_32.h5", 32, 1)
    _generate(d / "val_24.h5", 24, 2)
    from shared_data.data.convert import convert_to_npy

    convert_to_npy(d / "train_32.h5")
    convert_to_npy(d / "val_24.h5")
    return d


@pytest.fixture(scope="session")
def tiny_cfg(data_dir, tmp_path_factory):
    """``cpu_tiny`` pointed at the session's generated files, runs under a temporary exp_dir."""
    runs = tmp_path_factory.mktemp("runs")
    return config_mod.load_config(
        "cpu_tiny",
        overrides=dict(
            train_path=str(data_dir / "train_32.h5"),
            val_path=str(data_dir / "val_24.h5"),
            exp_dir=str(runs),
            xla_cache_dir=str(runs / "xla_cache"),
        ),
    )


@pytest.fixture(scope="session")
def tiny_argv(tiny_cfg):
    """The command-line arguments that select ``cpu_tiny`` on the session's data files and XLA cache
    (a later ``--set xla_cache_dir=...`` overrides the cache)."""
    return [
        "--config",
        "cpu_tiny",
        "--set",
        f"train_path={tiny_cfg.train_path}",
        "--set",
        f"val_path={tiny_cfg.val_path}",
        "--set",
        f"xla_cache_dir={tiny_cfg.xla_cache_dir}",
    ]


#: The flags of :func:`run_of_3_epochs`'s runs (after ``tiny_argv``).
RUN_OF_3_EPOCHS = ["--num_epochs", "3", "--set", "keep_checkpoints=3"]


@pytest.fixture(scope="session")
def run_of_3_epochs(tmp_path_factory, tiny_argv):
    """``run_of_3_epochs(framework, epochs, dest)``: ``dest`` becomes a copy of the run folder that
    ``tiny_argv`` with ``--num_epochs 3 --set keep_checkpoints=3 --stop_after_epoch EPOCHS`` leaves
    (checkpoints of epochs 1 to EPOCHS), trained once per framework and ``epochs`` in the session, in
    this process; returns ``dest``. The tests that resume it pass :data:`RUN_OF_3_EPOCHS`."""
    trained = {}

    def copy(framework: str, epochs: int, dest):
        if (framework, epochs) not in trained:
            folder = tmp_path_factory.mktemp(f"{framework}_epoch_{epochs}_of_3") / "w"
            train = __import__(f"{framework}_impl.train", fromlist=["train"])
            argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--stop_after_epoch", str(epochs), "--workdir", str(folder)]
            res = run_in_process(train.main, argv)
            assert res.returncode == 0, res.stderr[-2000:]
            trained[framework, epochs] = folder
        shutil.copytree(trained[framework, epochs], dest)
        return Path(dest)

    return copy


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A one-node SLURM for the session (``scripts/slurm_local.sh`` in a folder of its own, declaring at
    least 4 CPUs so a job runs 4 tasks on 2 cores); yields the environment its commands need
    (``SLURM_CONF``) and stops the daemons it started afterwards. Where it cannot start (no root to
    install the packages, no apt-get) the test skips with the reason; under ``CI=true`` it fails instead."""
    folder = tmp_path_factory.mktemp("slurm")
    script = REPO_ROOT / "scripts" / "slurm_local.sh"
    env = {**os.environ, "DLAS_SLURM_CPUS": str(max(os.cpu_count() or 1, 4))}
    res = subprocess.run(["bash", script, "start", folder], capture_output=True, text=True, timeout=900, env=env)
    if res.returncode != 0:
        reason = "local SLURM did not start: " + (res.stderr.strip().splitlines() or ["no message"])[-1]
        subprocess.run(["bash", script, "stop", folder], capture_output=True)
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    finally:
        subprocess.run(["bash", script, "stop", folder], capture_output=True, timeout=120)


@contextlib.contextmanager
def read_only(path):
    """``path`` (a file or a folder) read-only while the block runs, for root too: a read-only bind
    mount of it onto itself as root (root ignores permission bits), its write bits removed otherwise.
    Skips the test with the reason where the mount is not allowed."""
    path = Path(path)
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    for cmd in (["mount", "--bind", path, path], ["mount", "-o", "remount,bind,ro", path]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            if cmd[1] != "--bind":
                subprocess.run(["umount", path], capture_output=True)
            pytest.skip(f"cannot make {path} read-only with a bind mount: {res.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", path], capture_output=True, check=True)


def _has_gpu() -> bool:
    """An NVIDIA GPU is visible (``nvidia-smi -L`` lists one); asked without starting a framework."""
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, with the reason, where there is no GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a GPU (the GPU machine runs them: pytest -m gpu)")
        for item in gpu_items:
            item.add_marker(skip)


def train_with_signal_at(train_mod, monkeypatch, batch: int, signum: int, cfg, workdir, **kwargs):
    """Run ``train_mod.train_and_evaluate(cfg, workdir, **kwargs)`` under the trainers' signal handling,
    sending this process ``signum`` (a real signal) while the training input hands out its batch
    number ``batch`` (0-based, counted over the epochs of this invocation); return the
    :class:`shared_data.runtime.signals.Interrupted` it ends with."""
    from shared_data.runtime import signals

    make_input = train_mod.data_mod.make_input
    monkeypatch.setattr(train_mod.data_mod, "make_input", at_batch(make_input, batch, send(signum)))
    with signals.handled(), pytest.raises(signals.Interrupted) as stopped:
        train_mod.train_and_evaluate(cfg, workdir, **kwargs)
    monkeypatch.setattr(train_mod.data_mod, "make_input", make_input)
    return stopped.value
