"""Hostile input, generated: config values, damaged and odd files fed to the command lines. Each run
either succeeds with the right result or ends with exit code 2 and one ``error:`` line naming the
file, key or value: never a traceback (an uncaught exception fails the test), never a silently
wrong result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import RUN_OF_3_EPOCHS, run_in_process
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared_data.core import config as config_mod
from shared_data.core import config_schema
from shared_data.core.errors import ConfigError
from shared_data.data import convert, dataset, inspect
from shared_data.model import schedule, unet_spec
from shared_data.runtime import checks, records

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def cli(main, argv) -> tuple[int, str, str]:
    res = run_in_process(main, argv)
    return res.returncode, res.stdout, res.stderr


def assert_only_one_error_line(code: int, err: str, *names: str) -> None:
    """stderr holds nothing but one ``error:`` line, which names one of ``names``."""
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert any(n in lines[0] for n in names), (names, lines[0])


# --- config values -------------------------------------------------------------------------------

VALUES = st.one_of(
    st.integers(-3, 3),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1e-3", "2E-4", "-1e5", "nan", "inf", "fast", "", "None", "null", "[8, 16]", "true"]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-2, 70), max_size=4),
)


@pytest.mark.slow  # 300 generated configs
@settings(max_examples=300, **SETTINGS)
@given(key=st.sampled_from(sorted(config_schema.FIELDS)), value=VALUES)
@example(key="start_lr", value=3.4028235677973366e38)  # finite, but scaled beyond float32 in the LR table
def test_config_values_load_or_name_the_key(key, value):
    """Any value for any key: a config, or a ConfigError naming the key; an accepted config's derived
    numbers (batches, steps, layers, LR table) compute or raise a ConfigError, nothing else."""
    try:
        cfg = config_mod.load_config("cpu_tiny", overrides={key: value})
    except ConfigError as err:
        assert repr(key) in str(err) or key in str(err), str(err)
        return
    try:
        gb, _ = config_mod.batch_sizes(cfg, 1)
        steps = config_mod.steps_per_epoch(cfg, 1)
    except ConfigError:
        return
    assert gb >= 1 and steps >= 1
    assert len(unet_spec.layer_specs(cfg)) == 2 * len(unet_spec.encoder_widths(cfg))
    try:
        table = schedule.lr_table(cfg, gb, min(steps * cfg.num_epochs, 10**5))
    except ConfigError as err:
        assert key in ("start_lr", "end_lr") and repr(key) in str(err), str(err)
        return
    assert np.isfinite(table).all() and (table >= 0).all()


@settings(max_examples=6, **SETTINGS)
@given(
    key=st.sampled_from(["seed", "unet_widths", "crop_size", "start_lr", "num_data_workers", "Nsamples", "lambda_rho"]),
    value=st.sampled_from(["-1", "0", "[0, 8, 8]", "[-4, 8, 8]", "1e-3", "nan", "3", "[4, 8]"]),
)
def test_trainer_with_generated_values(tmp_path_factory, key, value, tiny_argv):
    """The JAX trainer end to end with one generated ``--set``: trains, or one error line naming the key
    before any epoch (no value passes the checks and crashes later)."""
    from jax_impl import train

    work = tmp_path_factory.mktemp("run")
    argv = [
        *tiny_argv,
        "--set",
        f"{key}={value}",
        "--workdir",
        str(work),
    ]
    code, out, err = cli(train.main, argv)
    if code == 0:
        assert "Time taken for epoch 1 is" in out and records.read_metrics(work)
    else:
        assert_only_one_error_line(code, err, key)
        assert "Time taken for epoch" not in out


# --- damaged and odd files --------------------------------------------------------------------------


def _original(tmp_path_factory, data_dir) -> Path:
    path = tmp_path_factory.mktemp("orig") / "vol.h5"
    shutil.copy(data_dir / "val_24.h5", path)
    return path


def _damage(path: Path, kind: str, where: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = path.stat().st_size
    if kind == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(int(where * size))
    elif kind == "flip":
        raw = bytearray(path.read_bytes())
        for pos in rng.integers(0, size, 1 + int(where * 8)):
            raw[pos] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(raw))
    else:
        with h5py.File(path, "r+") as f:
            if kind == "float64":
                data = f["Hydro"][...]
                del f["Hydro"]
                f["Hydro"] = data.astype(np.float64)
            elif kind == "channels_last":
                data = f["Nbody"][...]
                del f["Nbody"]
                f["Nbody"] = np.ascontiguousarray(np.moveaxis(data, 0, -1))
            elif kind == "names_short":
                f.attrs["Hydro_channels"] = json.dumps(["gas_density", "gas_temperature"])
            elif kind == "names_not_json":
                f.attrs["Nbody_channels"] = "dm_density, vx"
            elif kind == "nan":
                data = f["Hydro"][...]
                data[4, 3, 2, 1] = np.nan  # the last channel, which a short name list would leave unchecked
                f["Hydro"][...] = data
            elif kind == "missing":
                del f["Hydro"]
            elif kind == "value":  # one finite value changed in place, every attribute left as written
                data = f["Nbody"][...]
                data[1, 2, 3, 4] += 1e-3
                f["Nbody"][...] = data


KINDS = ["truncate", "flip", "float64", "channels_last", "names_short", "names_not_json", "nan", "missing", "value"]


@settings(max_examples=60, **SETTINGS)
@given(kind=st.sampled_from(KINDS), where=st.floats(0.0, 0.999), seed=st.integers(0, 2**16))
def test_damaged_files_through_inspect_and_convert(data_dir, tmp_path_factory, kind, where, seed):
    """``inspect`` and ``convert`` on a damaged copy: each either succeeds, and then the file's data
    are the original's (the damage missed them: each channel's recorded CRC-32 catches the rest), or
    ends with one error line naming the file."""
    orig = _original(tmp_path_factory, data_dir)
    with h5py.File(orig) as f:
        want = {k: f[k][...] for k in dataset.KEYS}
    path = orig.with_name("damaged.h5")
    shutil.copy(orig, path)
    _damage(path, kind, where, seed)
    must_fail = {  # the damage each command must refuse (convert does not read channel names)
        inspect.main: {"float64", "channels_last", "names_short", "names_not_json", "nan", "missing", "value"},
        convert.main: {"float64", "channels_last", "nan", "missing", "value"},
    }
    for main in (inspect.main, convert.main):
        code, out, err = cli(main, [str(path)])
        if code == 0:
            with h5py.File(path) as f:
                for k in dataset.KEYS:
                    np.testing.assert_array_equal(f[k][...], want[k], err_msg=f"{kind}: {k} changed yet accepted")
            assert kind not in must_fail[main], (main.__module__, kind)
        else:
            assert_only_one_error_line(code, err, str(path), "damaged.h5")


@settings(max_examples=25, **SETTINGS)
@given(
    kind=st.sampled_from(["flip", "truncate", "regenerated", "fortran", "float64", "channels_first"]),
    seed=st.integers(0, 2**16),
)
def test_npy_twins_that_do_not_match_are_refused(data_dir, tmp_path_factory, kind, seed):
    """The DALI numpy reader's .npy twins, damaged or made from other data: the run's data check
    refuses them with one line naming the .npy (no DALI traceback, no training on other data)."""
    folder = tmp_path_factory.mktemp("npy")
    h5 = folder / "train.h5"
    shutil.copy(data_dir / "train_32.h5", h5)
    convert.convert_to_npy(h5)
    nbody, _ = dataset.npy_paths(h5)
    arr = np.load(nbody)
    rng = np.random.default_rng(seed)
    if kind == "flip":
        raw = bytearray(nbody.read_bytes())
        pos = int(rng.integers(128, len(raw)))
        raw[pos] ^= int(rng.integers(1, 256))
        nbody.write_bytes(bytes(raw))
    elif kind == "truncate":
        with open(nbody, "r+b") as fh:
            fh.truncate(int(rng.integers(0, nbody.stat().st_size)))
    elif kind == "regenerated":
        np.save(nbody, (arr + 1e-3).astype(np.float32))
    elif kind == "fortran":
        np.save(nbody, np.asfortranarray(arr))
    elif kind == "float64":
        np.save(nbody, arr.astype(np.float64))
    elif kind == "channels_first":
        np.save(nbody, np.ascontiguousarray(np.moveaxis(arr, -1, 0)))
    cfg = config_mod.load_config(
        "cpu_tiny",
        overrides={"train_path": str(h5), "val_path": str(data_dir / "val_24.h5"), "data_loader_config": "dali-npy"},
    )
    with pytest.raises(dataset.DatasetError) as err:
        checks.check_data(cfg)
    assert str(nbody) in str(err.value)


@pytest.mark.slow
def test_torn_run_records_neither_crash_summary_nor_resume(tmp_path, tiny_argv):
    """A torn last line of metrics.jsonl and an empty run.json (a kill during a write on another file
    system): summary shows the complete epochs and --resume continues, rewriting both whole."""
    from dlas_compare import summary

    from jax_impl import train

    work = tmp_path / "runs" / "cpu_tiny" / "jax"
    argv = [
        *tiny_argv,
        "--num_epochs",
        "2",
        "--workdir",
        str(work),
    ]
    assert cli(train.main, [*argv, "--stop_after_epoch", "1"])[0] == 0
    with open(work / "metrics.jsonl", "a") as fh:
        fh.write('{"epoch": 2, "train_lo')
    (work / "run.json").write_text("")
    code, out, err = cli(
        summary.main, ["--config", "cpu_tiny", "--exp_dir", str(tmp_path / "runs"), "--frameworks", "jax"]
    )
    assert code == 0 and "final train loss" in out, err
    code, out, err = cli(train.main, [*argv, "--resume"])
    assert code == 0, err
    assert [r["epoch"] for r in records.read_metrics(work)] == [1, 2]
    assert json.loads((work / "run.json").read_text())["framework"] == "jax"


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(framework, tmp_path, caplog, tiny_argv, run_of_3_epochs):
    """The newest checkpoint damaged: --resume warns and continues from the one before; leftovers of a
    killed TF save are removed."""
    import logging

    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    work = run_of_3_epochs(framework, 2, tmp_path / "w")
    argv = [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work)]
    ckpts = work / "checkpoints"
    if framework == "jax":
        for f in (ckpts / "2").rglob("*"):
            if f.is_file() and f.stat().st_size > 0:
                f.write_bytes(b"\0" * f.stat().st_size)
    else:
        (ckpts / "ckpt-2.data-00000-of-00001").write_bytes(b"damaged")
        (ckpts / "ckpt-3_temp").mkdir()
        (ckpts / "checkpoint.tmp123").write_text("partial")
    with caplog.at_level(logging.WARNING):
        code, out, err = cli(train.main, [*argv, "--resume"])
    assert code == 0, err
    assert "does not restore" in caplog.text and "epoch 1, the newest one that restores" in caplog.text
    assert [r["epoch"] for r in records.read_metrics(work)] == [1, 2, 3]
    if framework == "tf":
        assert not (ckpts / "ckpt-3_temp").exists() and not (ckpts / "checkpoint.tmp123").exists()


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_resume_with_another_config_is_one_error_line(framework, tmp_path, tiny_argv, run_of_3_epochs):
    """A run folder of another net: one error line, and nothing else on stderr (orbax's background
    threads included), in a process of its own as a user runs it (the run it resumes trains in this
    process, where the framework is imported already: the session's epoch 1 of 3)."""
    import subprocess
    import sys

    train_args = [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(run_of_3_epochs(framework, 1, tmp_path / "w"))]
    argv = [sys.executable, "-m", f"{framework}_impl.train", *train_args]
    res = subprocess.run(
        [*argv, "--set", "unet_widths=[4, 8, 16]", "--resume"], capture_output=True, text=True, timeout=600
    )
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1 and "does not match this config" in errors[0], res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception" not in res.stderr, res.stderr[-3000:]
