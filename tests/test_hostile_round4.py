"""Hostile input, round 4: damaged run records (a stop's data cursor, a checkpoint's checksum record)
are a warning and the resume rule's fallback, never a resume blocked until a user deletes files;
values the model cannot fit, seeds, paths and nesting that break a command end in one ``error:``
line before any work; the study scripts read torn and foreign records in one line."""

from __future__ import annotations

import json
import logging
import signal
import types

import numpy as np
import pytest
from conftest import RUN_OF_3_EPOCHS, assert_one_error_line, checkpoint_epochs, run_in_process, train_with_signal_at

from shared_data.core import config as config_mod
from shared_data.data import dataset
from shared_data.runtime import resume as resume_mod

STEPS = 4  # steps per epoch of the stopped runs: Nsamples 16, global batch 4


def _sound_cursor() -> dict:
    """A cursor as a stop at epoch 2, step 4 of 4 writes it."""
    return dict(epoch=1, step=3, global_step=STEPS + 3, steps_per_epoch=STEPS, losses=[0.5, 0.4, 0.3])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (dict(step=1256, global_step=STEPS + 1256), "has step 1256, beyond an epoch of 4 steps"),
        (dict(global_step=None), "has no 'global_step'"),
        (dict(losses=None), "has no 'losses'"),
        (dict(losses=3), "has losses = 3, expected a list of numbers"),
        (dict(losses=["a", 1, 2]), "has losses = ['a', 1, 2], expected a list of numbers"),
        (dict(losses=[0.5] * 150), "has 150 losses for its 3 steps of the epoch"),
        (dict(epoch=50), "has global_step 7, expected epoch x steps_per_epoch + step = 203"),
        (
            dict(epoch=50, global_step=50 * STEPS + 3),
            "is in epoch 51, beyond the run's checkpoints (the newest is of epoch 1)",
        ),
        (dict(step=-1, global_step=STEPS - 1), "has step = -1, expected a count (an integer >= 0)"),
        (dict(step="3"), "has step = '3', expected a count (an integer >= 0)"),
        (dict(epoch=True), "has epoch = True, expected a count (an integer >= 0)"),
        (dict(steps_per_epoch=8), "steps_per_epoch"),  # another global batch: not damage
        ({}, None),
    ],
)
def test_cursor_problem_names_what_is_wrong(change, problem):
    cursor = _sound_cursor()
    for key, value in change.items():
        if value is None:
            del cursor[key]
        else:
            cursor[key] = value
    assert resume_mod.cursor_problem(cursor, STEPS, 1) == problem
    assert resume_mod.cursor_problem([cursor], STEPS, 1) == "is a JSON list, expected an object"


def test_a_long_value_in_a_cursor_is_quoted_short():
    cursor = {**_sound_cursor(), "losses": "x" * 10**6}
    problem = resume_mod.cursor_problem(cursor, STEPS, 1)
    assert problem.startswith("has losses = 'xxx") and problem.endswith("xxx', expected a list of numbers")
    assert len(problem) < 150


@pytest.mark.parametrize("text", ['{"epo', "\xff\xfe", ""])
def test_a_cursor_that_does_not_parse_is_kept_aside(tmp_path, caplog, text):
    """Read twice: the second resume no longer meets the cursor (the folder is kept aside once)."""
    mid = tmp_path / "mid_epoch"
    mid.mkdir()
    (mid / "cursor.json").write_bytes(text.encode("latin-1"))
    folder = types.SimpleNamespace(mid_epoch_dir=mid, steps_per_epoch=STEPS, main=True)
    assert resume_mod.mid_epoch_cursor(folder, 1) is None
    assert f"{mid / 'cursor.json'} does not parse (" in caplog.text
    assert f"kept as {tmp_path / 'mid_epoch.damaged'}" in caplog.text
    assert not mid.exists() and (tmp_path / "mid_epoch.damaged" / "cursor.json").read_bytes() == text.encode("latin-1")
    mid.mkdir()  # a second damaged save keeps the first one
    (mid / "cursor.json").write_text("[]")
    assert resume_mod.mid_epoch_cursor(folder, 1) is None
    assert (tmp_path / "mid_epoch.damaged.2" / "cursor.json").read_text() == "[]"


class _SavedAt:
    """A stand-in for a framework's ``Checkpoints`` of ``mid_epoch/`` holding the checkpoint of ``step``."""

    def __init__(self, step: int):
        self.step, self.restored = step, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def epochs(self):
        return [self.step]

    def restore(self, step):
        self.restored.append(step)
        return "state"


def test_a_cursor_that_names_another_checkpoint_than_the_saved_one_is_kept_aside(tmp_path, caplog):
    """A sound cursor whose global step is not the number of the save's checkpoint: kept aside with
    one warning, nothing restored; a cursor that names it resumes there."""
    mid = tmp_path / "mid_epoch"
    mid.mkdir()
    folder = types.SimpleNamespace(mid_epoch_dir=mid, steps_per_epoch=STEPS, main=True)
    (mid / "cursor.json").write_text(json.dumps(_sound_cursor()))
    saved = _SavedAt(STEPS + 3)
    assert resume_mod._mid_epoch_start(folder, 1, lambda: saved) == resume_mod.Start(1, 3, (0.5, 0.4, 0.3), "state")
    saved = _SavedAt(STEPS + 2)
    assert resume_mod._mid_epoch_start(folder, 1, lambda: saved) is None and saved.restored == []
    assert (
        f"cursor.json has global_step 7, but {mid / 'checkpoints'} holds the checkpoint of global step 6: kept as"
        in (caplog.text)
    )
    assert (tmp_path / "mid_epoch.damaged" / "cursor.json").is_file() and not mid.exists()


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_damaged_cursor_resumes_from_the_epoch_checkpoint(framework, tiny_cfg, tiny_argv, tmp_path, monkeypatch):
    """A stop's cursor with a step beyond the epoch ended the resume in ``UnboundLocalError`` (every
    later --resume too, until mid_epoch/ was deleted by hand): one warning naming the file and what
    is wrong, the folder kept aside, and epoch 2 trained from the checkpoint of epoch 1."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    workdir = tmp_path / "w"
    cfg = config_mod.load_config(
        "cpu_tiny", overrides={**config_mod.config_dict(tiny_cfg), "num_epochs": 2, "Nsamples": 4 * STEPS}
    )
    stopped = train_with_signal_at(train, monkeypatch, STEPS + 2, signal.SIGTERM, cfg, workdir, num_devices=1)
    assert "at epoch 2, step 4 of 4" in str(stopped)
    path = workdir / "mid_epoch" / "cursor.json"
    cursor = json.loads(path.read_text())
    assert cursor["global_step"] == STEPS + 3
    path.write_text(json.dumps({**cursor, "step": 1256}))
    argv = [*tiny_argv, "--set", "num_epochs=2", "--set", f"Nsamples={4 * STEPS}", "--num_devices", "1"]
    res = run_in_process(train.main, [*argv, "--workdir", str(workdir), "--resume"])
    assert res.returncode == 0, res.stderr[-2000:]
    kept = workdir / "mid_epoch.damaged"
    assert f"{path} has step 1256, beyond an epoch of 4 steps: kept as {kept}" in res.stdout
    assert f"resumed from {workdir / 'checkpoints'} at epoch 1" in res.stdout
    assert json.loads((kept / "cursor.json").read_text())["step"] == 1256
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and checkpoint_epochs(workdir / "checkpoints") == [1, 2]
    again = run_in_process(train.main, [*argv, "--workdir", str(workdir), "--resume"])
    assert again.returncode == 0 and "all 2 epochs of this run are trained" in again.stdout, again.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_damaged_checksum_record_is_a_damaged_checkpoint(framework, tmp_path, tiny_argv, run_of_3_epochs):
    """``block_bytes`` 0 in the newest checkpoint's record ended --resume and predict --workdir in
    ``ZeroDivisionError``: --resume, predict and export each warn naming the record and what is wrong
    and use the checkpoint before (predict's provenance names epoch 1); the record is left as it was."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    predict = __import__(f"{framework}_impl.predict", fromlist=["predict"])
    export = __import__(f"{framework}_impl.export", fromlist=["export"])
    work = run_of_3_epochs(framework, 2, tmp_path / "w")
    path = work / "checksums" / "2.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "block_bytes": 0}))
    record = path.read_text()
    damaged = f"its checksum record {path} is damaged (block_bytes is 0, expected a positive integer)"
    skipped = f"checkpoint of epoch 2 does not restore (checkpoint {work / 'checkpoints'}/"
    fallback = "using the checkpoint of epoch 1, the newest one that restores"
    val_path = tiny_argv[tiny_argv.index("--set") + 3].split("=", 1)[1]
    out = tmp_path / "p.h5"
    res = run_in_process(
        predict.main, ["--config", "cpu_tiny", "--workdir", str(work), "--input", val_path, "--out", str(out)]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    logged = res.stdout + res.stderr
    assert skipped in logged and f"2: {damaged}" in logged and fallback in logged, logged[-2000:]
    import h5py

    with h5py.File(out) as f:
        assert f.attrs["prediction_weights"].endswith("checkpoints epoch 1"), f.attrs["prediction_weights"]
    res = run_in_process(export.main, ["--config", "cpu_tiny", "--workdir", str(work), "--out", str(tmp_path / "e")])
    assert res.returncode == 0, res.stderr[-2000:]
    assert fallback in res.stdout + res.stderr and path.read_text() == record
    res = run_in_process(train.main, [*tiny_argv, *RUN_OF_3_EPOCHS, "--workdir", str(work), "--resume"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert skipped in res.stdout and f"2: {damaged}" in res.stdout and fallback in res.stdout
    assert [json.loads(line)["epoch"] for line in (work / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def _without_attributes(src, dest, hydro=None, nbody=None):
    """An HDF5 file of ``src``'s Nbody and Hydro (or ``nbody(Nbody)``, ``hydro(Hydro)``) without any
    attribute (a foreign file)."""
    import h5py

    with h5py.File(src) as f, h5py.File(dest, "w") as g:
        g["Nbody"] = f["Nbody"][...] if nbody is None else nbody(f["Nbody"][...])
        g["Hydro"] = f["Hydro"][...] if hydro is None else hydro(f["Hydro"][...])
    return dest


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_targets_outside_the_models_output_end_the_run_before_its_first_step(framework, data_dir, tmp_path, tiny_argv):
    """An attribute-less file with Hydro = 30 everywhere trained to a loss of 30 (rc 0): the model's
    output is tanh's, so the run ends before its first step naming the file, channel, voxel and value."""
    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    bad = _without_attributes(data_dir / "train_32.h5", tmp_path / "h30.h5", lambda h: np.full_like(h, 30.0))
    res = run_in_process(train.main, [*tiny_argv, "--set", f"train_path={bad}", "--workdir", str(tmp_path / "w")])
    assert_one_error_line(
        res,
        f"{bad}: Hydro channel 0 holds 30 at voxel (0, 0, 0), outside [-1, 1], the range of the model's output (tanh)",
    )
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


@pytest.mark.parametrize("loader", ["inmem", "lowmem", "dali-npy", "dali-h5", "device"])
def test_a_target_beyond_the_models_output_is_named_whatever_the_loader(tiny_cfg, data_dir, tmp_path, loader):
    """One value of 1.5 in the training targets (within float16's bound): the run folder's data check
    names the file (the .npy twin for DALI's numpy reader), channel, voxel and value."""
    import shutil

    import h5py

    from shared_data.core.errors import DatasetError
    from shared_data.runtime.run_folder import RunFolder

    for f in data_dir.glob("train_32*"):
        if not f.name.endswith(".source.json"):  # twins without records: the values may change in place
            shutil.copy(f, tmp_path / f.name)
    train = tmp_path / "train_32.h5"
    with h5py.File(train, "r+") as f:
        del f.attrs["Hydro_crc32"]
        f["Hydro"][4, 3, 4, 5] = 1.5
    twin = dataset.npy_paths(train)[1]
    values = np.load(twin)
    values[3, 4, 5, 4] = 1.5
    np.save(twin, values)
    cfg = config_mod.replace(tiny_cfg, train_path=str(train), data_loader_config=loader)
    with pytest.raises(DatasetError) as err:
        RunFolder(cfg, tmp_path / "w", "jax", "test", {}, 1)
    where = f"{twin} (DALI's numpy reader reads it)" if loader == "dali-npy" else str(train)
    assert str(err.value).startswith(f"{where}: Hydro channel 4 holds 1.5 at voxel (3, 4, 5), outside [-1, 1]")
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


def test_the_target_scan_names_the_first_value_beyond_one_in_the_file_and_its_twin(data_dir, tmp_path):
    """Every loader: the HDF5 scan (h5 readers) and the Hydro .npy twin's (DALI's numpy reader); the
    Hydro twin scanned as inputs meets the inputs' bound (+-100) only; exactly +-1 passes."""
    from shared_data.core.errors import DatasetError
    from shared_data.data import dataset
    from shared_data.data.convert import convert_to_npy

    def edit(h):
        h[3, 5, 6, 7] = -1.0
        h[2, 9, 1, 4] = -793.0
        return h

    path = _without_attributes(data_dir / "train_32.h5", tmp_path / "t.h5", edit)
    with pytest.raises(DatasetError) as err:
        dataset.scan_values(path)
    assert str(err.value).startswith(f"{path}: Hydro channel 2 holds -793 at voxel (9, 1, 4), outside [-1, 1]")
    convert_to_npy(path)
    nbody, hydro = dataset.npy_paths(path)
    dataset.check_finite_npy(nbody)
    with pytest.raises(DatasetError, match=r"holds -793 at voxel \(9, 1, 4\), beyond \+-100"):
        dataset.check_finite_npy(hydro, targets=False)
    with pytest.raises(DatasetError) as err:
        dataset.check_finite_npy(hydro, targets=True)
    assert str(err.value).startswith(
        f"{hydro} (DALI's numpy reader reads it): Hydro channel 2 holds -793 at voxel (9, 1, 4), outside [-1, 1]"
    )
    edge = _without_attributes(data_dir / "train_32.h5", tmp_path / "edge.h5", lambda h: np.clip(h * 100, -1, 1))
    dataset.scan_values(edge)


def test_inputs_far_outside_the_transforms_range_are_named_in_the_file_and_its_twin(data_dir, tmp_path):
    """An input (Nbody) of 1e4 (a file written without the transforms) is refused by the HDF5 scan and the
    Nbody twin's, naming the channel, voxel and value; exactly +-100 passes."""
    from shared_data.core.errors import DatasetError
    from shared_data.data import dataset
    from shared_data.data.convert import convert_to_npy

    def edit(n):
        n[1, 2, 3, 4] = 1e4
        return n

    path = _without_attributes(data_dir / "train_32.h5", tmp_path / "t.h5", nbody=edit)
    with pytest.raises(DatasetError) as err:
        dataset.scan_values(path)
    assert str(err.value).startswith(f"{path}: Nbody channel 1 holds 10000 at voxel (2, 3, 4), beyond +-100, far")
    convert_to_npy(path)
    with pytest.raises(DatasetError) as err:
        dataset.check_finite_npy(dataset.npy_paths(path)[0])
    assert str(err.value).startswith(
        f"{dataset.npy_paths(path)[0]} (DALI's numpy reader reads it): Nbody channel 1 holds 10000 at voxel (2, 3, 4)"
    )
    edge = _without_attributes(
        data_dir / "train_32.h5", tmp_path / "edge.h5", nbody=lambda n: np.clip(n * 1e4, -100, 100)
    )
    dataset.scan_values(edge)


def test_validate_scores_any_finite_file(data_dir, tmp_path, caplog):
    """A truth with Hydro of order 1e3 (exp(14 x) overflows float64) ended validate in ``TypeError:
    NoneType + NoneType``: every metric is finite; a prediction of an attribute-less volume records
    the checksum computed from its values, and validate computes the truth's where it has none, so an
    unrelated attribute-less truth is refused; a file that records none is scored with one warning."""
    import h5py

    from shared_data.inference import validate

    truth = data_dir / "train_32.h5"
    big = _without_attributes(truth, tmp_path / "big.h5", lambda h: h * 1e4)
    flags = {"voxel_size": 0.25}
    record = validate.validate_files(truth, big, tmp_path / "v", flags, plot=False)
    for name in ("gas_density", "gas_temperature"):
        pdf = record["pdf"][name]
        assert all(e is not None for e in pdf["edges"]) and all(v is not None for v in pdf["l1_distance"].values())
        assert record["power"][name]["summary"]["model"]["r_mean"] is not None
    same = validate.validate_files(truth, truth, tmp_path / "s", flags, plot=False)  # the usual path unchanged
    assert same["pdf"]["gas_density"]["l1_distance"]["pred"] == 0.0

    plain = _without_attributes(truth, tmp_path / "plain.h5")
    moved = tmp_path / "moved.h5"  # another volume of the same side: the dark matter moved by 3 voxels
    with h5py.File(truth) as f, h5py.File(moved, "w") as g:
        g["Nbody"], g["Hydro"] = np.roll(f["Nbody"][...], 3, axis=1), f["Hydro"][...]
    pred = tmp_path / "pred.h5"
    with h5py.File(plain) as f, h5py.File(pred, "w") as g:
        g["Hydro"] = f["Hydro"][...]
        g.attrs["prediction_input"] = str(plain)
        g.attrs["prediction_input_Nbody_crc32"] = json.dumps(dataset.channel_crc32(f["Nbody"][...]))
    validate.validate_files(pred, plain, tmp_path / "p", flags, plot=False)  # its own volume: no attribute needed
    argv = ["--pred", str(pred), "--truth", str(moved), "--out", str(tmp_path / "m"), "--voxel_size", "0.25"]
    res = run_in_process(validate.main, argv)
    assert_one_error_line(res, f"{pred} was predicted from {plain}, whose Nbody checksums differ from {moved}'s")
    with caplog.at_level(logging.WARNING, logger="dlas"):
        validate.validate_files(plain, moved, tmp_path / "n", flags, plot=False)
    assert (
        f"{plain} records no checksum of the volume it was predicted from (prediction_input_Nbody_crc32): "
        in caplog.text
    )


def test_predict_records_the_checksum_of_an_attribute_less_input(data_dir, tiny_cfg, tmp_path):
    """An input without ``Nbody_crc32`` (the tutorial's files) is identified by the checksum computed
    from its values, the one the generator writes for the same values."""
    import h5py

    from shared_data.model import unet_spec

    from jax_impl import predict

    weights = tmp_path / "w.npz"
    unet_spec.save_weights(weights, unet_spec.init_weights(tiny_cfg, 0))
    plain = _without_attributes(data_dir / "val_24.h5", tmp_path / "plain.h5")
    out = tmp_path / "p.h5"
    res = run_in_process(
        predict.main, ["--config", "cpu_tiny", "--weights", str(weights), "--input", str(plain), "--out", str(out)]
    )
    assert res.returncode == 0, res.stderr[-2000:]
    with h5py.File(out) as f, h5py.File(data_dir / "val_24.h5") as g:
        assert f.attrs["prediction_input_Nbody_crc32"] == g.attrs["Nbody_crc32"]


# --- item 4: seeds, symbolic-link loops, nesting, anchor bombs, NaN rates, tutorial keys -------------


def _anchor_bomb(levels: int = 7) -> str:
    """A YAML mapping whose last value is 9**levels integers through anchors (a few hundred characters)."""
    out, prev = ["&a [4,4,4,4,4,4,4,4,4]"], "a"
    for name in "bcdefghij"[: levels - 1]:
        out.append(f"&{name} [{','.join(['*' + prev] * 9)}]")
        prev = name
    return "{" + ", ".join(f"k{i}: {o}" for i, o in enumerate(out)) + f", z: *{prev}}}"


@pytest.mark.parametrize("seed", ["-1", str(2**80), "9" * 4000])
def test_a_seed_outside_int64_is_one_line_before_the_simulation(tmp_path, seed):
    """``--seed -1``: NumPy's ValueError; ``--seed 2**80``: simulated, then h5py's TypeError."""
    from shared_data.data import generate

    out = tmp_path / "g.h5"
    res = run_in_process(generate.main, ["--out", str(out), "--size", "8", "--seed", seed])
    assert_one_error_line(res, f"--seed {seed[:18]}", "expected an integer in [0, 9223372036854775807]")
    assert len(res.stderr) < 200 and "[generate]" not in res.stderr and not out.exists()
    res = run_in_process(generate.main, ["--out", str(out), "--size", "8", "--seed", "x" * 10**5])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and len(res.stderr) < 600, res.stderr
    assert "error: argument --seed: invalid int value: 'xxx" in res.stderr and "characters left out" in res.stderr


def test_the_largest_seed_is_written_and_read_back(tmp_path):
    import h5py

    from shared_data.data import generate

    out = tmp_path / "g.h5"
    assert run_in_process(generate.main, ["--out", str(out), "--size", "8", "--seed", str(2**63 - 1)]).returncode == 0
    with h5py.File(out) as f:
        assert int(f.attrs["seed"]) == 2**63 - 1


def test_a_loop_of_symbolic_links_is_one_line(tmp_path, tiny_argv):
    """``--workdir``, ``--exp_dir`` and ``--out`` through a loop of links ended in ``OSError: [Errno 40]``."""
    from shared_data.core.errors import run_cli
    from shared_data.data import generate

    from jax_impl import train

    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "back")
    (tmp_path / "back").symlink_to(loop)
    where = f"{loop} is a loop of symbolic links (a link that leads back to itself)"
    res = run_in_process(train.main, [*tiny_argv, "--workdir", str(loop / "run")])
    assert_one_error_line(res, f"--workdir {loop / 'run'}: {where}")
    res = run_in_process(train.main, [*tiny_argv, "--set", f"exp_dir={loop}"])
    assert_one_error_line(res, f"the run folder (exp_dir/<config>/<framework>) {loop / 'cpu_tiny' / 'jax'}: {where}")
    res = run_in_process(generate.main, ["--out", str(loop / "g.h5"), "--size", "8"])
    assert_one_error_line(res, f"--out {loop / 'g.h5'}: {where}")

    def opens(argv):  # any command whose own checks do not see the loop: run_cli's line
        open(loop / "x")

    res = run_in_process(lambda argv: run_cli(opens, argv) and None, [])
    assert res.stderr.strip() == (
        f"error: {loop / 'x'}: too many levels of symbolic links (a link that leads back to itself); "
        "expected a real path"
    )


@pytest.mark.parametrize("where", ["set", "yaml"])
@pytest.mark.parametrize("value", ["[" * 5000 + "1" + "]" * 5000, _anchor_bomb()])
def test_deep_nesting_and_anchor_bombs_are_one_short_line(tmp_path, tiny_argv, where, value):
    """A value 5000 lists deep: RecursionError (210 kB of traceback); an anchor bomb as ``unet_widths``:
    an error line that quoted its 4.8 million integers (2 GB for 9 levels). Both: one line of at most
    a few hundred characters, at once."""
    import time

    from jax_impl import train

    if where == "set":
        argv = [*tiny_argv, "--set", f"unet_widths={value}", "--workdir", str(tmp_path / "w")]
    else:
        yaml_path = tmp_path / "c.yaml"
        yaml_path.write_text(f"c:\n  unet_widths: {value}\n")
        argv = ["--yaml_config", str(yaml_path), "--config", "c", "--workdir", str(tmp_path / "w")]
    t0 = time.perf_counter()
    res = run_in_process(train.main, argv)
    assert time.perf_counter() - t0 < 10
    if value.startswith("[["):
        assert_one_error_line(res, "a value nested deeper than the YAML reader follows")
    elif where == "set":
        assert_one_error_line(res, "key 'unet_widths': expected list of integer, got {'k0': [4, 4, 4")
    else:  # the section lacks the other keys: the first one missing is named
        assert_one_error_line(res, f"{tmp_path / 'c.yaml'} [c]: missing key")
    assert len(res.stderr) < 600, len(res.stderr)


def test_quoted_never_expands_a_shared_structure():
    import yaml

    from shared_data.core.errors import quoted

    bomb = yaml.safe_load(_anchor_bomb(9))["z"]  # 9**9 integers through shared lists
    assert quoted(bomb) == "[[[[[...], [...], [...], [...], [...], [...], [...], [...], [...]], [[...], [...], ..."[:80]
    assert len(quoted("x" * 10**6)) == 80 and "..." in quoted(2**4000) and len(quoted(2**4000)) <= 40


@pytest.mark.parametrize("rate", ["nan", "inf", "-1", "0"])
def test_scaling_model_refuses_a_rate_that_is_not_a_positive_number(rate):
    from dlas_compare import scaling_model

    res = run_in_process(scaling_model.main, ["--nic_gbps", rate])
    assert_one_error_line(res, f"--nic_gbps {float(rate)}: a rate in GB/s is a positive finite number")
    assert "nan" not in res.stdout


@pytest.mark.parametrize(
    ("override", "text"),
    [
        ("data_size=32", "'data_size' is the tutorial's name of this kit's 'crop_size', "),
        ("data_size=32", "--set takes this kit's keys: --set crop_size=32"),
        ("lr_schedule.start_lr=0.01", "this kit's 'start_lr', which a tutorial-format YAML section translates"),
        ("enable_apex=true", "'enable_apex' is a key of the tutorial's YAML that does not apply here (Adam "),
        ("weight_init=normal", "'weight_init' is a key of the tutorial's YAML, which a tutorial-format YAML section"),
        ("nmu_epochs=2", "unknown key 'nmu_epochs' (did you mean 'num_epochs'?)"),
    ],
)
def test_a_tutorial_key_in_set_is_named_as_the_tutorials(tiny_argv, override, text):
    """``--set data_size=32`` said "unknown key" though the YAML takes ``data_size`` in a tutorial section."""
    from jax_impl import train

    assert_one_error_line(run_in_process(train.main, [*tiny_argv, "--set", override]), f"override '{override}': ", text)


# --- item 5: the validation's size, generate on a full disk -------------------------------------------


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_validation_of_millions_of_crops_is_one_line_before_compiling(framework, tiny_argv, tmp_path):
    """``Nsamples_val=2**24``: minutes of planning 16.7M crops in silence, then the pass itself; now one
    line at once naming the key, the steps and the bound; a run of the usual size says its validation
    before compiling."""
    import time

    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    t0 = time.perf_counter()
    res = run_in_process(train.main, [*tiny_argv, "--set", f"Nsamples_val={2**24}", "--workdir", str(tmp_path / "w")])
    assert time.perf_counter() - t0 < 20
    assert_one_error_line(
        res,
        "config 'cpu_tiny' key 'Nsamples_val': 16777216 crops in batches of 4 are 4194304 validation steps an "
        "epoch; expected at most 100000",
    )
    assert not (tmp_path / "w").exists()


def test_the_validation_is_said_before_its_crops_are_planned(tiny_cfg, caplog):
    from shared_data.core import config as config_mod
    from shared_data.runtime import sizing

    with caplog.at_level(logging.INFO, logger="dlas"):
        assert sizing.validation_steps(config_mod.replace(tiny_cfg, Nsamples_val=9), 1) == 3
    assert "validation: 9 crops of val_24.h5 each epoch (the same ones), 3 steps of 4" in caplog.text
    assert sizing.validation_steps(config_mod.replace(tiny_cfg, Nsamples_val=4 * sizing.MAX_VAL_STEPS), 1) == 10**5


def test_generate_on_a_full_disk_is_one_line(tmp_path):
    """Four h5py "Exception ignored in ObjectID.__dealloc__" tracebacks came before the line (a 600 KiB
    tmpfs: root only, skipped where mounting is not allowed)."""
    import subprocess

    from conftest import run_module

    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(small)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        res = run_module("shared_data.data.generate", "--out", str(small / "g.h5"), "--size", "32", "--chunk", "16")
        lines = [line for line in res.stderr.splitlines() if not line.startswith("[generate]")]
        assert res.returncode == 2 and lines == [f"error: cannot write {small / 'g.h5'} (No space left on device)"], (
            res.stderr[-3000:]
        )
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


# --- item 6: the study scripts on torn, damaged and foreign records ------------------------------------


def _study_module(relative: str):
    """A study's script (not a package module), imported from its file."""
    import importlib.util

    from shared_data.core.config import REPO_ROOT

    path = REPO_ROOT / "experiments" / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_study", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def recorded_run(tmp_path):
    """The recorded run of ``quality_nonlinear`` (seed 1: 14 evaluations), extracted under ``tmp_path/runs``."""
    import tarfile

    from shared_data.core.config import REPO_ROOT

    with tarfile.open(REPO_ROOT / "experiments/nonlinear_gas/results/ttq_quality_nonlinear_call1/runs.tar") as tar:
        tar.extractall(tmp_path / "runs", filter="data")
    return tmp_path / "runs" / "seed-1"


def _edit_line(path, index: int, edit) -> None:
    lines = path.read_text().splitlines()
    record = json.loads(lines[index])
    edit(record)
    lines[index] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")


def _edit_json(path, edit) -> None:
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


@pytest.mark.study
@pytest.mark.parametrize(
    ("damage", "text"),
    [
        (lambda run: (run / "run.json").write_text("{not json"), "run.json is not valid JSON (Expecting property"),
        (
            lambda run: (run / "run.json").write_bytes(b"\xff\xfe\x00"),
            "run.json is not text (a binary or damaged file)",
        ),
        (
            lambda run: _edit_json(run / "run.json", lambda i: i["time_to_quality"].update(time_to_quality_sec="12")),
            "run.json: time_to_quality's time_to_quality_sec is '12', expected seconds or null",
        ),
        (
            lambda run: _edit_line(run / "quality.jsonl", 0, lambda r: r.update(time_sec="52")),
            "quality.jsonl line 1: the evaluation of epoch 1: time_sec is '52', expected a finite number",
        ),
        (
            lambda run: _edit_line(run / "quality.jsonl", -1, lambda r: r.pop("shortfall")),
            "quality.jsonl: the evaluation of epoch 14 has no 'shortfall'",
        ),
        (
            lambda run: _edit_line(run / "quality.jsonl", 2, lambda r: r["channels"]["gas_density"].pop("r_worst")),
            "quality.jsonl: the evaluation of epoch 3: gas_density has no 'r_worst'",
        ),
        (
            lambda run: (run / "quality.jsonl").write_bytes(bytes(range(256)) * 8),
            "quality.jsonl is not text (a binary or damaged file), expected JSON lines",
        ),
        (
            lambda run: _edit_line(run / "metrics.jsonl", 0, lambda r: r.update(wall_sec="x")),
            "metrics.jsonl: the record of epoch 1 has 'x' wall_sec, expected seconds",
        ),
    ],
)
def test_ttq_table_names_a_damaged_record_in_one_line(recorded_run, damage, text):
    """Each was a traceback (JSONDecodeError, KeyError, UnicodeDecodeError, ValueError of a format)."""
    table = _study_module("time_to_quality/table.py")
    damage(recorded_run)
    res = run_in_process(table.main, [str(recorded_run.parent)])
    assert_one_error_line(res, f"{recorded_run}/", text)
    assert res.stdout == ""


@pytest.mark.study
def test_ttq_table_skips_a_torn_last_line_and_writes_its_figures_whole(recorded_run, tmp_path, caplog):
    """A killed trainer's torn last line is skipped with a warning (``curve.py`` skips it too); a
    ``--plot`` folder that is read-only or full is one line before or after the records are read, and
    leaves no partial figure."""
    import subprocess

    from conftest import read_only

    table = _study_module("time_to_quality/table.py")
    quality_path = recorded_run / "quality.jsonl"
    lines = quality_path.read_text().splitlines()
    quality_path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:120])
    with caplog.at_level(logging.WARNING, logger="dlas"):
        res = run_in_process(table.main, [str(recorded_run.parent), "--plot", str(tmp_path / "c.png")])
    assert res.returncode == 0, res.stderr
    assert f"{quality_path} line 14 is not a whole JSON record (a torn write): skipped" in caplog.text
    assert "| seed-1 | 13 |" in res.stdout and (tmp_path / "c.png").stat().st_size > 0
    folder = tmp_path / "figures"
    folder.mkdir()
    with read_only(folder):
        res = run_in_process(table.main, [str(recorded_run.parent), "--plot", str(folder / "c.png")])
    assert_one_error_line(res, f"--plot {folder / 'c.png'}: cannot write in {folder}")
    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20k", "tmpfs", str(small)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        res = run_in_process(table.main, [str(recorded_run.parent), "--spectra", str(small / "s.png")])
        assert_one_error_line(res, f"cannot write {small / 's.png'} (No space left on device)")
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


def _hand_written_curve(folder, val_path=None):
    """A run folder with two hand-written evaluations (k bins of 1, 2, 3 h/Mpc) and, with ``val_path``,
    a run.json naming the validation volume it was scored on."""
    k = [1.0, 2.0, 3.0]
    channel = {"k": k, "r": [0.9, 0.8, 0.7], "ratio": [1.0, 1.1, 1.2], "r_worst": 0.7, "ratio_dev_worst": 0.2}
    records = [
        {"epoch": e, "time_sec": 60.0 * e, "channels": {n: dict(channel) for n in quality_channels()}} for e in (1, 2)
    ]
    folder.mkdir(parents=True)
    (folder / "quality.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if val_path is not None:
        (folder / "run.json").write_text(json.dumps({"config_values": {"val_path": str(val_path)}, "invocations": []}))
    return folder


def quality_channels():
    from shared_data.inference import quality

    return quality.CHANNELS


@pytest.mark.study
@pytest.mark.parametrize(
    ("edit", "text"),
    [
        (lambda r: r.pop("channels"), "quality.jsonl line 2: the record has no 'channels'"),
        (
            lambda r: r["channels"]["gas_temperature"].update(r=[0.9, 0.8]),
            "quality.jsonl line 2: the evaluation of epoch 2: gas_temperature's r is [0.9, 0.8], expected 3 numbers",
        ),
        (
            lambda r: r.update(time_sec="120"),
            "quality.jsonl line 2: the evaluation of epoch 2: time_sec is '120', expected a finite number of seconds",
        ),
    ],
)
def test_nonlinear_gas_curve_names_a_damaged_record_in_one_line(data_dir, tmp_path, edit, text):
    """A record without ``channels``, an ``r`` shorter than ``k``, a string time: each was a traceback."""
    curve = _study_module("nonlinear_gas/curve.py")
    run = _hand_written_curve(tmp_path / "records" / "run")
    _edit_line(run / "quality.jsonl", 1, edit)
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(data_dir / "val_24.h5")])
    assert_one_error_line(res, f"{run}/{text}")
    assert res.stdout == ""


@pytest.mark.study
def test_nonlinear_gas_curve_refuses_a_volume_the_runs_were_not_scored_on(data_dir, tmp_path):
    """``--val`` of another volume printed that volume's baselines beside the runs (rc 0): the run's
    run.json names its volume; another one (other Nbody values, or where the named file is not at
    hand, other k bins) is one line; the same values under another name pass."""
    import shutil

    curve = _study_module("nonlinear_gas/curve.py")
    val, other = data_dir / "val_24.h5", tmp_path / "other.h5"
    _without_attributes(data_dir / "val_24.h5", other, lambda h: h)
    with __import__("h5py").File(other, "r+") as f:
        f["Nbody"][0, 0, 0, 0] += 1.0
    run = _hand_written_curve(tmp_path / "records" / "run", val_path=val)
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(other)])
    assert_one_error_line(
        res,
        f"{run}/run.json: the run was scored on {val}, whose Nbody values differ from --val {other}'s; "
        f"pass --val {val}",
    )
    copy = tmp_path / "copy.h5"
    shutil.copy(val, copy)
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(copy)])
    assert res.returncode == 0 and "| run | end | 2 | 120 |" in res.stdout, res.stderr
    _edit_json(run / "run.json", lambda i: i["config_values"].update(val_path="data/val_128.h5"))  # not at hand
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(val)])
    assert_one_error_line(
        res,
        f"{run}/quality.jsonl: the run was scored on data/val_128.h5 (not at hand here), whose k bins are not --val",
    )


@pytest.mark.slow
@pytest.mark.study
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_time_to_quality_run_records_its_volume_and_curve_checks_val_against_it(
    framework, tiny_cfg, data_dir, tmp_path
):
    """run.json's ``time_to_quality`` records the validation volume's path and Nbody checksums (the
    file's attribute); ``curve.py --val`` of another volume is refused by them, the same volume passes."""
    import h5py

    from shared_data.runtime.records import read_run_info

    train = __import__(f"{framework}_impl.train", fromlist=["train"])
    reachable = dict(quality_every_epochs=1, quality_r_min=-1.0, quality_ratio_tol=1e6, quality_beat_baseline=False)
    cfg = config_mod.replace(tiny_cfg, num_epochs=1, quality_beat_non_ml=False, **reachable)
    run = tmp_path / "records" / "run"
    train.train_and_evaluate(cfg, run)
    val = data_dir / "val_24.h5"
    with h5py.File(val) as f:
        recorded = json.loads(f.attrs["Nbody_crc32"])
    assert read_run_info(run)["time_to_quality"]["volume"] == {"path": str(val.absolute()), "Nbody_crc32": recorded}
    curve = _study_module("nonlinear_gas/curve.py")
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(val)])
    assert res.returncode == 0 and "| run | end | 1 |" in res.stdout, res.stderr
    moved = tmp_path / "moved.h5"
    with h5py.File(val) as f, h5py.File(moved, "w") as g:
        g["Nbody"], g["Hydro"] = np.roll(f["Nbody"][...], 3, axis=1), f["Hydro"][...]
        for key, value in f.attrs.items():
            if key != "Nbody_crc32":
                g.attrs[key] = value
    res = run_in_process(curve.main, [str(tmp_path / "records"), "--val", str(moved)])
    assert_one_error_line(
        res,
        f"{run}/run.json: the run was scored on {val.absolute()}, whose Nbody checksums differ from --val {moved}'s",
    )


def test_validate_says_what_a_constant_or_out_of_range_file_is(data_dir, tmp_path, caplog):
    """A prediction of Hydro = 30 everywhere scored against itself printed 'r < 0.9 from k = never'
    (a perfect-looking line for an r that is undefined) and one of ~1e3 against the truth gave no
    word that it is no output of the model: the spectra lines say r is undefined, and a file beyond
    tanh's [-1, 1] is one warning naming it."""
    from shared_data.inference import validate

    truth = data_dir / "train_32.h5"
    flat = _without_attributes(truth, tmp_path / "flat.h5", lambda h: np.full_like(h, 30.0))
    big = _without_attributes(truth, tmp_path / "big.h5", lambda h: h * 1e3)
    flags = {"voxel_size": 0.25}
    with caplog.at_level(logging.INFO, logger="dlas"):
        validate.validate_files(flat, flat, tmp_path / "f", flags, plot=False)
    spectra = [r.getMessage() for r in caplog.records if r.getMessage().startswith("P(k) ")]
    assert spectra and all("r < 0.9 from k = undefined" in line for line in spectra), spectra
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dlas"):
        validate.validate_files(big, truth, tmp_path / "b", flags, plot=False)
    warnings = [r.getMessage() for r in caplog.records if "beyond [-1, 1]" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"{big}: Hydro holds "), warnings
