"""Hostile files, round 3: outputs in read-only or misplaced places and records that cannot be read
end in one ``error:`` line naming the path and what is wrong (or, where the output is optional, one
warning and the run goes on), before any work where that is possible."""

from __future__ import annotations

import json
import logging
import os

import pytest
from conftest import assert_one_error_line, read_only, run_in_process

from dlas_compare import doctor
from shared_data.core import config as config_mod
from shared_data.core.errors import UserError
from shared_data.runtime.epoch_report import EpochReport
from shared_data.runtime.run_folder import RunFolder


@pytest.mark.parametrize("where", ["folder", "read-only folder"])
def test_doctor_json_onto_a_folder_or_into_a_read_only_one(tmp_path, monkeypatch, where):
    """``dlas-doctor --json PATH`` is checked before the checks run (they take seconds)."""
    monkeypatch.setattr(doctor, "checks", lambda: pytest.fail("the checks ran before --json was checked"))
    folder = tmp_path / "reports"
    folder.mkdir()
    if where == "folder":
        assert_one_error_line(run_in_process(doctor.main, ["--json", str(folder)]), f"--json {folder} is a folder")
        return
    with read_only(folder):
        res = run_in_process(doctor.main, ["--json", str(folder / "d.json")])
    assert_one_error_line(res, f"--json {folder / 'd.json'}: cannot write in {folder} (", ")")
    assert list(folder.iterdir()) == []


def _resume_with_run_json(cfg, workdir, content: bytes | None) -> None:
    """A first invocation of ``cfg`` in ``workdir``, then ``run.json`` replaced by ``content`` (None: a
    folder in its place) and a resume at epoch 1, both through the trainers' run folder and report."""
    first = RunFolder(cfg, workdir, "jax", "test", {}, 1)
    EpochReport(first, 0.0).begin(0, {})
    first.close()
    (workdir / "run.json").unlink()
    if content is None:
        (workdir / "run.json").mkdir()
    else:
        (workdir / "run.json").write_bytes(content)
    second = RunFolder(cfg, workdir, "jax", "test", {}, 1)
    try:
        EpochReport(second, 0.0).begin(1, {})
    finally:
        second.close()


@pytest.mark.parametrize(
    "content, problem",
    [
        (bytes(range(256)), "is not text (a binary or damaged file)"),
        (b'{"framework": "jax", "invoc', "is not valid JSON (Unterminated string starting at: line 1 column 22)"),
        (b"[1, 2]", "holds a JSON list, not an object"),
        (b'{"invocations": 3}', "holds invocations that are not a list"),
    ],
)
def test_an_unusable_run_json_on_resume_is_said_and_kept(tiny_cfg, tmp_path, caplog, content, problem):
    """A resume that cannot read ``run.json`` says so once, with what is lost (the earlier invocations'
    record and the recipe-change check), keeps the file as ``run.json.damaged`` and starts a new record."""
    with caplog.at_level(logging.WARNING, logger="dlas"):
        _resume_with_run_json(tiny_cfg, tmp_path, content)
    said = [r.getMessage() for r in caplog.records if "run.json" in r.getMessage()]
    assert said == [
        f"{tmp_path / 'run.json'} {problem}: kept as {tmp_path / 'run.json.damaged'}; a new run.json starts with "
        "this invocation: the record of the earlier invocations (commands, configs, versions) is not carried over, "
        "and this resume's config cannot be compared with the run's (no recipe-change check)"
    ], said
    assert (tmp_path / "run.json.damaged").read_bytes() == content
    info = json.loads((tmp_path / "run.json").read_text())
    assert [i["start_epoch"] for i in info["invocations"]] == [1] and info["framework"] == "jax"


def test_a_folder_in_place_of_run_json_is_one_line(tiny_cfg, tmp_path):
    with pytest.raises(UserError, match=r"cannot write .*run\.json \((Is a directory|Directory not empty)\)"):
        _resume_with_run_json(tiny_cfg, tmp_path, None)


# --- the run folder's optional records and the compilation caches ---------------------------------------


def _tb_file(tb):
    tb.write_text("not a folder")


def _tb_dangling_link(tb):
    tb.symlink_to(tb.parent / "gone")


@pytest.mark.parametrize(
    "make, problem",
    [
        (_tb_file, "is a file, expected a folder"),
        (_tb_dangling_link, "is a symbolic link to"),
        (None, "cannot write in"),
    ],
)
def test_a_tensorboard_folder_that_cannot_be_written_is_one_line_before_compiling(tiny_argv, tmp_path, make, problem):
    """``tensorboard: true`` with ``tb`` a file, a dangling link or a read-only folder: one line naming
    it and ``--set tensorboard=false`` (the records are asked for, so the run does not go on without
    them), before the steps are compiled."""
    from jax_impl import train

    work = tmp_path / "w"
    work.mkdir()
    tb = work / "tb"
    argv = [*tiny_argv, "--set", "tensorboard=true", "--workdir", str(work)]
    if make is not None:
        make(tb)
        res = run_in_process(train.main, argv)
    else:
        tb.mkdir()
        with read_only(tb):
            res = run_in_process(train.main, argv)
    assert_one_error_line(res, f"the run's TensorBoard folder {tb}", problem, "--set tensorboard=false runs without")
    assert "compile:" not in res.stdout and not (work / "checkpoints").exists()


def test_a_read_only_out_log_on_resume_is_one_line(tiny_argv, tmp_path):
    from jax_impl import train

    work = tmp_path / "w"
    work.mkdir()
    (work / "out.log").write_text("an earlier run's lines\n")
    with read_only(work / "out.log"):
        res = run_in_process(train.main, [*tiny_argv, "--workdir", str(work), "--resume"])
    assert_one_error_line(res, f"cannot write {work / 'out.log'} (", "): nothing is trained")
    assert (work / "out.log").read_text() == "an earlier run's lines\n"


@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_a_compilation_cache_that_cannot_be_written_is_a_warning_and_left_out(
    framework, tiny_cfg, tmp_path, monkeypatch, caplog
):
    """The persistent compilation cache is optional (it saves a later run's compile time): a folder
    that cannot be written, named by the environment (``TF_XLA_FLAGS``, ``JAX_COMPILATION_CACHE_DIR``)
    or by ``xla_cache_dir``, is one warning and the run compiles without it (TensorFlow failed its
    first step with a PermissionDeniedError traceback)."""
    distribute = __import__(f"{framework}_impl.distribute", fromlist=["distribute"])
    (tmp_path / "blocker").write_text("a file")
    under_file = tmp_path / "blocker" / "cache"
    cfg = config_mod.replace(tiny_cfg, xla_cache_dir=str(under_file))
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    if framework == "jax":
        import jax

        monkeypatch.setattr(jax.config, "update", lambda name, value: pytest.fail(f"{name} = {value} set"))
    ro = tmp_path / "ro"
    ro.mkdir()
    with caplog.at_level(logging.WARNING, logger="dlas"), read_only(ro):
        settings = distribute.configure_xla(cfg)  # the config's folder, under a file
        if framework == "tf":
            monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_min_cluster_size=4 --tf_xla_persistent_cache_directory={ro}")
        else:
            monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(ro))
        from_env = distribute.configure_xla(cfg)  # the environment's folder, read-only
    said = [r.getMessage() for r in caplog.records]
    source = "TF_XLA_FLAGS" if framework == "tf" else "JAX_COMPILATION_CACHE_DIR"
    left_out = ": this run compiles without a persistent compilation cache"
    assert len(said) == 2, said
    assert said[0] == (
        f"the compilation cache of xla_cache_dir {under_file}{'/tf' if framework == 'tf' else ''}: "
        f"{tmp_path / 'blocker'} is a file, expected a folder{left_out}"
    )
    assert said[1].startswith(f"the compilation cache of {source} {ro}: cannot write in {ro} (") and said[1].endswith(
        left_out
    )
    if framework == "tf":
        assert settings["TF_XLA_FLAGS"] == "" and from_env["TF_XLA_FLAGS"] == "--tf_xla_min_cluster_size=4"
        assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_min_cluster_size=4"
    else:
        assert "jax_compilation_cache_dir" not in settings and "jax_compilation_cache_dir" not in from_env
