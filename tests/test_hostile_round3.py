"""Hostile input, round 3: no output of a command replaces one of its inputs (by path, symbolic link
or hard link); no non-finite weights or predictions are read or written; values from the
environment and the launch scripts are checked where they enter. Every case ends before any work in
one ``error:`` line, with the inputs unchanged. (Loader workers and signals: test_crop_workers.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import assert_one_error_line, run_in_process

from shared_data.core import config as config_mod
from shared_data.core import files
from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError
from shared_data.inference import predict as predict_mod
from shared_data.inference import validate
from shared_data.model import unet_spec
from shared_data.runtime import launch

from jax_impl import export as jax_export
from jax_impl import predict as jax_predict
from jax_impl import train as jax_train


@pytest.fixture(scope="module")
def cfg():
    return config_mod.load_config("cpu_tiny")


def _alias(kind: str, target, path):
    """``path`` made the same file as ``target``: the same path, a symbolic link or a hard link."""
    if kind == "path":
        return target
    (os.symlink if kind == "symlink" else os.link)(target, path)
    return path


@pytest.mark.parametrize("kind", ["path", "symlink", "hardlink"])
def test_check_not_input_sees_paths_links_and_folders(tmp_path, kind):
    data = tmp_path / "d.h5"
    data.write_bytes(b"volume")
    out = _alias(kind, data, tmp_path / "out.npz")
    with pytest.raises(UserError, match=r"^--out .* is train_path .*d\.h5 \(.*\), which this command reads"):
        files.check_not_input({"--out": out}, {"train_path": data, "--weights": None})
    assert data.read_bytes() == b"volume"
    files.check_not_input({"--out": tmp_path / "other.npz"}, {"train_path": data})  # another file: fine
    files.check_not_input({"--out": data}, {"missing": tmp_path / "missing.h5"})  # a missing input: its own check
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="lies inside --workdir's checkpoints"):
        files.check_not_input(
            {"--out": tmp_path / "run/checkpoints/p.h5"}, {"--workdir's checkpoints": tmp_path / "run/checkpoints"}
        )
    with pytest.raises(UserError, match="holds train_path"):
        files.check_not_input({"the run folder's checkpoints": tmp_path}, {"train_path": data})


@pytest.mark.parametrize("kind", ["path", "hardlink"])
def test_trainer_refuses_save_weights_onto_its_training_volume(tiny_argv, tiny_cfg, tmp_path, kind):
    """``--set train_path=d.h5 --save_weights d.h5`` replaced the training volume with the weights."""
    data = tmp_path / "d.h5"
    shutil.copy(tiny_cfg.train_path, data)
    before = data.read_bytes()
    out = _alias(kind, data, tmp_path / "w.npz")
    argv = [*tiny_argv, "--set", f"train_path={data}", "--workdir", str(tmp_path / "run"), "--save_weights", str(out)]
    res = run_in_process(jax_train.main, argv)
    assert_one_error_line(res, f"--save_weights {out} is train_path {data}")
    assert data.read_bytes() == before and not (tmp_path / "run" / "run.json").exists()


@pytest.mark.parametrize("name", ["run.json", "metrics.jsonl", "checkpoints/w.npz", "link.npz"])
def test_trainer_refuses_save_weights_onto_its_own_run_files(tiny_argv, tmp_path, name):
    """``--save_weights RUN/run.json`` trained and then replaced the run's record with the weights
    (rc 0): the run's own files are refused by path before the run writes them, and through a link
    once they exist."""
    run = tmp_path / "run"
    if name.startswith("checkpoints"):
        (run / "checkpoints").mkdir(parents=True)
    if name == "link.npz":
        run.mkdir()
        (run / "out.log").write_text("an earlier invocation's log\n")
        os.symlink(run / "out.log", tmp_path / name)
    out = tmp_path / name if name == "link.npz" else run / name
    res = run_in_process(jax_train.main, [*tiny_argv, "--workdir", str(run), "--save_weights", str(out)])
    assert_one_error_line(res, f"--save_weights {out}", "the run folder's")
    assert not (run / "run.json").exists() and not (run / "checkpoints" / "w.npz").exists()


def test_predict_and_export_refuse_outputs_that_are_their_weights(cfg, data_dir, tmp_path):
    """``predict --weights w.npz --out w.npz`` replaced the weights with the prediction."""
    weights = tmp_path / "w.npz"
    unet_spec.save_weights(weights, unet_spec.init_weights(cfg, 0))
    before = weights.read_bytes()
    base = ["--config", "cpu_tiny", "--weights", str(weights)]
    res = run_in_process(jax_predict.main, [*base, "--input", str(data_dir / "val_24.h5"), "--out", str(weights)])
    assert_one_error_line(res, f"--out {weights} is --weights {weights} (the same path)")
    (tmp_path / "report").mkdir()
    link = _alias("symlink", data_dir / "val_24.h5", tmp_path / "report" / "validation.json")
    argv = [
        *base,
        "--input",
        str(data_dir / "val_24.h5"),
        "--out",
        str(tmp_path / "p.h5"),
        "--validate",
        str(tmp_path / "report"),
    ]
    res = run_in_process(jax_predict.main, argv)
    assert_one_error_line(res, f"--validate's validation.json {link} is --input")
    out = tmp_path / "exported"
    out.mkdir()
    os.link(weights, out / "export.json")
    res = run_in_process(jax_export.main, [*base, "--out", str(out)])
    assert_one_error_line(res, "--out's export.json", "is --weights", "a hard link of the same file")
    assert weights.read_bytes() == before and not (tmp_path / "p.h5").exists()


def test_validate_refuses_a_report_that_is_its_truth(data_dir, tmp_path):
    truth = tmp_path / "t.h5"
    shutil.copy(data_dir / "val_24.h5", truth)
    before = truth.read_bytes()
    res = run_in_process(validate.main, ["--pred", str(truth), "--truth", str(truth), "--out", str(tmp_path)])
    assert res.returncode == 0  # a prediction equal to the truth is a (trivial) validation
    os.replace(tmp_path / "validation.json", tmp_path / "v.json")
    os.symlink(truth, tmp_path / "validation.json")
    res = run_in_process(validate.main, ["--pred", str(truth), "--truth", str(truth), "--out", str(tmp_path)])
    assert_one_error_line(res, "--out's validation.json", f"is --pred {truth} (the same file through a symbolic link)")
    assert truth.read_bytes() == before


# --- non-finite weights and predictions ------------------------------------------------------------


@pytest.fixture
def nan_weights(cfg, tmp_path):
    """A canonical weights file of cpu_tiny with one NaN in the first up-conv kernel."""
    weights = unet_spec.init_weights(cfg, 0)
    name = next(k for k in weights if k.startswith("up"))
    weights[name][0, 1, 2, 0, 0] = np.nan
    path = tmp_path / "nan.npz"
    np.savez(path, **weights)
    return path, name


def test_non_finite_weights_are_refused_by_predict_export_and_init_weights(nan_weights, data_dir, tiny_argv, tmp_path):
    path, name = nan_weights
    base = ["--config", "cpu_tiny", "--weights", str(path)]
    res = run_in_process(
        jax_predict.main, [*base, "--input", str(data_dir / "val_24.h5"), "--out", str(tmp_path / "p.h5")]
    )
    assert_one_error_line(res, f"weights file {path}: array {name!r} holds nan at index (0, 1, 2, 0, 0)")
    res = run_in_process(jax_export.main, [*base, "--out", str(tmp_path / "exported")])
    assert_one_error_line(res, f"array {name!r} holds nan")
    argv = [*tiny_argv, "--workdir", str(tmp_path / "run"), "--init_weights", str(path)]
    res = run_in_process(jax_train.main, argv)
    assert_one_error_line(res, f"weights file {path}: array {name!r} holds nan")
    assert not (tmp_path / "p.h5").exists() and not (tmp_path / "exported" / "unet.jax_export").exists()
    with pytest.raises(UserError, match=r"cannot write weights file .*holds inf"):
        unet_spec.save_weights(tmp_path / "w.npz", {"down1/kernel": np.array([1.0, np.inf], np.float32)})
    assert not list(tmp_path.glob("w*.npz"))


def test_a_prediction_that_overflows_is_not_written(cfg, data_dir, tmp_path):
    """Finite weights of 1e30 overflow float32 in the first layers: the prediction is NaN and is
    refused before a file is written (it was written with exit code 0)."""
    weights = {k: np.full_like(v, 1e30) for k, v in unet_spec.init_weights(cfg, 0).items()}
    path = tmp_path / "big.npz"
    unet_spec.save_weights(path, weights)
    out = tmp_path / "p.h5"
    argv = ["--config", "cpu_tiny", "--weights", str(path), "--input", str(data_dir / "val_24.h5"), "--out", str(out)]
    res = run_in_process(jax_predict.main, argv)
    assert_one_error_line(res, "the prediction with weights", "not finite", "nothing was written")
    assert not out.exists() and not list(tmp_path.glob(".p.h5*"))
    with pytest.raises(UserError, match=r"holds nan at voxel \(1, 0, 0\), channel 2 \(1 of 24 values"):
        hydro = np.zeros((2, 2, 2, 3), np.float32)
        hydro[1, 0, 0, 2] = np.nan
        predict_mod.check_prediction(hydro, "w")


# --- values from the environment ---------------------------------------------------------------------


COORDINATOR = {"JAX_COORDINATOR_ADDRESS": "localhost:1"}


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"JAX_COORDINATOR_ADDRESS": "localhost:1", "JAX_NUM_PROCESSES": "abc", "JAX_PROCESS_ID": "0"},
            "JAX_NUM_PROCESSES='abc'",
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "localhost:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
            "JAX_PROCESS_ID='2': expected an integer >= 0 and < 2",
        ),
        ({"SLURM_STEP_NUM_TASKS": "abc", "SLURM_PROCID": "0"}, "SLURM_STEP_NUM_TASKS='abc': expected an integer >= 1"),
    ],
)
def test_environment_integers_are_one_error_line(tiny_argv, tmp_path, monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    res = run_in_process(jax_train.main, [*tiny_argv, "--workdir", str(tmp_path / "run")])
    assert_one_error_line(res, message)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"JAX_NUM_PROCESSES": "abc"}, "JAX_NUM_PROCESSES='abc': expected an integer >= 1"),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "two"}, "SLURM_NTASKS='two': expected an integer >= 1"),
    ],
)
def test_task_counts_recorded_in_run_json_are_checked(tiny_argv, tmp_path, monkeypatch, env, message):
    """A one-process run records its launch (``launch.launch_info``): the task count came from ``int()``."""
    for name in ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    res = run_in_process(jax_train.main, [*tiny_argv, "--workdir", str(tmp_path / "run")])
    assert_one_error_line(res, message)
    assert not (tmp_path / "run").exists()


def test_slurm_job_ids_and_ports_are_checked():
    """The SLURM job id picks the coordinator's port (JAX) and the workers' ports (TF)."""
    from jax_impl import cluster as jax_cluster

    step = {"SLURM_STEP_NODELIST": "node[03-04]", "SLURM_JOB_ID": "4097"}
    assert jax_cluster.slurm_coordinator(step) == "node03:61441"
    assert jax_cluster.slurm_coordinator({**step, "JAX_COORDINATOR_PORT": "1234"}) == "node03:1234"
    with pytest.raises(UserError, match=r"^environment variable SLURM_JOB_ID='12x': expected an integer >= 0$"):
        jax_cluster.slurm_coordinator({**step, "SLURM_JOB_ID": "12x"})
    with pytest.raises(UserError, match="JAX_COORDINATOR_PORT='http': expected an integer >= 1 and < 65536"):
        jax_cluster.slurm_coordinator({**step, "JAX_COORDINATOR_PORT": "http"})
    from tf_impl.cluster import slurm_port_base

    assert slurm_port_base({"SLURM_JOB_ID": "2049"}) == 40008
    with pytest.raises(UserError, match=r"^environment variable SLURM_JOB_ID='x1': expected an integer >= 0$"):
        slurm_port_base({"SLURM_JOB_ID": "x1"})


def test_an_incomplete_slurm_step_is_one_error_line_in_tf(monkeypatch):
    """TensorFlow's SLURM resolver raised a RuntimeError traceback where a SLURM step variable was
    missing (a process that says it is a task of a 2-task step, not started by srun)."""
    from tf_impl.cluster import slurm_resolver

    step = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "node01", "SLURM_JOB_ID": "5"}
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE", raising=False)
    with pytest.raises(UserError, match=r"^tf.distribute \(SLURM\): SLURM_STEP_TASKS_PER_NODE not found"):
        slurm_resolver()


def test_slurm_local_id_is_checked_against_the_tasks_on_the_node():
    env = {
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS_PER_NODE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    assert launch.task_gpus({**env, "SLURM_LOCALID": "1"}) == [1]
    for bad in ("abc", "2", "-1"):
        with pytest.raises(UserError, match=f"SLURM_LOCALID='{bad}': expected an integer >= 0 and < 2"):
            launch.task_gpus({**env, "SLURM_LOCALID": bad})


@pytest.mark.parametrize("nproc", ["0", "-3", "two"])
def test_single_host_launch_refuses_a_process_count_below_one(nproc):
    """``NPROC=0`` or ``-3`` ran one process."""
    script = REPO_ROOT / "scripts" / "launch" / "single_host.sh"
    env = {**os.environ, "NPROC": nproc, "PY": "echo"}  # the trainer is not started either way
    res = subprocess.run(["bash", str(script), "jax", "cpu_tiny"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.strip() == f"error: NPROC={nproc}: expected a whole number of processes, at least 1"


# --- the time-to-quality target against the validation volume ------------------------------------------


def test_quality_target_is_checked_against_the_validation_volume(tiny_cfg, data_dir, tmp_path):
    """``quality_k_max`` above the validation volume's Nyquist wavenumber was accepted as the target;
    a validation file without ``box_size_mpc_h`` was told to use ``--voxel_size``, a flag the
    trainer does not have."""
    import types

    import h5py

    from shared_data.core.errors import ConfigError, DatasetError
    from shared_data.inference import quality_check

    def monitor(**overrides):
        cfg = config_mod.replace(tiny_cfg, quality_every_epochs=1, **overrides)
        return quality_check.Monitor(types.SimpleNamespace(cfg=cfg, main=False, workdir=tmp_path), None, "cpu")

    # val_24.h5: 24 voxels in a 6 Mpc/h box, voxels of 0.25 Mpc/h, Nyquist pi / 0.25 = 12.566 h/Mpc
    assert monitor(quality_k_max=12.5).target.k_max == 12.5
    with pytest.raises(ConfigError, match=r"quality_k_max = 13.0 h/Mpc lies above the Nyquist wavenumber \(12.6 h/Mpc"):
        monitor(quality_k_max=13.0)
    val = tmp_path / "val.h5"
    shutil.copy(data_dir / "val_24.h5", val)
    with h5py.File(val, "a") as f:
        del f.attrs["box_size_mpc_h"]
    with pytest.raises(DatasetError, match="write it into the file as attribute 'box_size_mpc_h'") as err:
        monitor(val_path=str(val))
    assert "--voxel_size" not in str(err.value)


def test_a_twin_changed_with_its_size_and_time_kept_is_refused(data_dir, tmp_path):
    """A ``.npy`` twin edited in place with its size and modification time set back trained
    through ``dali-npy``: its recorded CRC-32 is now checked whatever its size and time."""
    from shared_data.data import convert, dataset

    h5 = tmp_path / "v.h5"
    shutil.copy(data_dir / "val_24.h5", h5)
    nbody, _ = convert.convert_to_npy(h5)
    info = dataset.validate(h5, 4, 5)
    dataset.check_npy_twins(info, dataset.npy_paths(h5))
    st = nbody.stat()
    arr = np.load(nbody, mmap_mode="r+")
    arr[23, 23, 23, 3] += 1.0  # a voxel the spot check does not sample (the last one)
    arr.flush()
    del arr
    os.utime(nbody, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert nbody.stat().st_size == st.st_size and nbody.stat().st_mtime_ns == st.st_mtime_ns
    with pytest.raises(dataset.DatasetError, match=r"v_Nbody\.npy changed after it was converted"):
        dataset.check_npy_twins(info, dataset.npy_paths(h5))


def test_export_size_has_one_limit_in_both_frameworks(tmp_path):
    """TF refused ``--size`` above 1024 (the largest crop side) while JAX exported 1048576."""
    from shared_data.inference import export as export_mod

    cfg = config_mod.load_config("cpu_tiny")
    assert export_mod.check_size(cfg, 1024) == 1024
    for size in (1032, 1048576):
        with pytest.raises(UserError, match=f"--size {size}: expected a multiple of 2\\*\\*levels = 8 from 8 to 1024"):
            export_mod.check_size(cfg, size)
    res = run_in_process(
        jax_export.main, ["--config", "cpu_tiny", "--out", str(tmp_path), "--size", "1048576", "--weights", "w"]
    )
    assert_one_error_line(res, "--size 1048576")


# --- a full disk ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "convert", "predict", "validate", "export"])
def test_a_full_disk_ends_in_one_line_and_leaves_no_file(command, data_dir, tmp_path):
    """A write that fails (here: past the file-size limit) ends in one ``error:`` line with exit code
    2: no traceback, no native crash after the message (HDF5 crashed at exit, rc 139; the
    converter's memory map died of SIGBUS), and no partial or hidden file left (export left the
    folder it made)."""
    import sys

    out = tmp_path / "out"
    out.mkdir()
    vol = tmp_path / "v.h5"
    shutil.copy(data_dir / "train_32.h5", vol)  # 32^3: 1.2 MB of data, a prediction of 0.66 MB
    weights = tmp_path / "w.npz"
    unet_spec.save_weights(weights, unet_spec.init_weights(config_mod.load_config("cpu_tiny"), 0))
    args = {
        "generate": ["shared_data.data.generate", "--out", str(out / "g.h5"), "--size", "48"],
        "convert": ["shared_data.data.convert", str(out / "v.h5")],
        "predict": ["jax_impl.predict", "--config", "cpu_tiny", "--weights", str(weights), "--input", str(vol)]
        + ["--out", str(out / "p.h5")],
        "validate": ["shared_data.inference.validate", "--pred", str(vol), "--truth", str(vol)]
        + ["--out", str(out / "report")],
        "export": ["jax_impl.export", "--config", "cpu_tiny", "--weights", str(weights), "--out", str(out / "exp")],
    }[command]
    if command == "convert":
        os.symlink(vol, out / "v.h5")
    # files may grow to 64 KiB (``ulimit -f``, KiB in bash; a cpu_tiny export is 97 KiB): a longer
    # write fails with EFBIG as a full disk's fails with ENOSPC (Python ignores SIGXFSZ), without a
    # disk to fill; the converter's Nbody twin (512 KiB) fits under 600 KiB and its Hydro twin (640
    # KiB) does not: the pair goes, not only the second
    limit = "600" if command == "convert" else "64"
    limited = ["bash", "-c", f'ulimit -f {limit} && exec "$@"', "bash", sys.executable, "-m", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run(limited, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, env=env)
    assert_one_error_line(res, "cannot write", "(File too large)")
    assert sorted(p.name for p in out.iterdir()) == (["v.h5"] if command == "convert" else [])


_FIGURE_CHILD = """
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from dlas_compare.ladder_figure import save
from shared_data.core.errors import run_cli

def main(argv):
    fig, ax = plt.subplots(figsize=(8, 6))
    ax.imshow([[i * j for i in range(300)] for j in range(300)])
    save(fig, sys.argv[1])

raise SystemExit(run_cli(main))
"""


def test_a_failed_write_that_no_command_reports_is_one_error_line(tmp_path):
    """The ladder's figure on a full disk (matplotlib's write, all measurements taken) ended in an
    ENOSPC traceback: a write error that reaches the command's end unreported is one line, naming
    the kit's code that wrote, and the figure's temporary file is gone."""
    import sys

    script = ["bash", "-c", 'ulimit -f 8 && exec "$@"', "bash", sys.executable, "-c", _FIGURE_CHILD]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run([*script, str(tmp_path / "f.png")], capture_output=True, text=True, env=env, timeout=120)
    assert_one_error_line(res, "a write failed (File too large) at dlas_compare/ladder_figure.py:", "(save)")
    assert list(tmp_path.iterdir()) == []


_APPEND_CHILD = """
import resource, sys
from dlas_compare.benchmark import append_records

path = sys.argv[1]
append_records(path, [{"rung": 1}])
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))  # a full disk's ENOSPC, as EFBIG
for target in (path, path + ".new"):
    try:
        append_records(target, [{"rung": 2, "pad": "x" * 6000}, {"rung": 3, "pad": "y" * 6000}])
    except OSError as err:
        print(err.strerror)
"""


def test_a_records_append_that_fails_leaves_the_file_as_it_was(tmp_path):
    """The ladder's --out on a full disk kept half a record as its last line (and --resume then
    refused the file): an append is all or none, and a file it made is removed."""
    import sys

    path = tmp_path / "ladder.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run([sys.executable, "-c", _APPEND_CHILD, str(path)], capture_output=True, text=True, env=env)
    assert res.stdout.split("\n")[:2] == ["File too large"] * 2, res.stderr[-2000:]
    assert path.read_text() == '{"rung": 1}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["ladder.jsonl"]


def test_a_name_over_the_systems_limit_is_one_error_line(data_dir, tmp_path):
    """A 300-character file name (over NAME_MAX, 255 on Linux) ended in an ENAMETOOLONG traceback."""
    from shared_data.data import generate

    long_name = str(tmp_path / ("a" * 300 + ".h5"))
    res = run_in_process(generate.main, ["--out", long_name, "--size", "16"])
    assert_one_error_line(res, f"({len(long_name)} characters): a name longer than the file system allows")
    argv = ["--config", "cpu_tiny", "--weights", "w.npz", "--input", str(data_dir / "val_24.h5"), "--out", long_name]
    assert_one_error_line(run_in_process(jax_predict.main, argv), "a name longer than the file system allows")
