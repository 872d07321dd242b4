"""Hostile files, round 3: outputs in read-only or misplaced places and records that cannot be read
end in one ``error:`` line naming the path and what is wrong (or, where the output is optional, one
warning and the run goes on), before any work where that is possible."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import assert_one_error_line, read_only, run_in_process

from dlas_compare import doctor
from shared_data.core.errors import UserError
from shared_data.runtime import run


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
    folder in its place) and a resume at epoch 1, both through :class:`shared_data.runtime.run.Run`."""
    first = run.Run(cfg, workdir, "jax", "test", {}, 1)
    first.begin(0, 0.0, {}, lambda: 0.0)
    first.finish(None)
    (workdir / "run.json").unlink()
    if content is None:
        (workdir / "run.json").mkdir()
    else:
        (workdir / "run.json").write_bytes(content)
    second = run.Run(cfg, workdir, "jax", "test", {}, 1, resume=True)
    try:
        second.begin(1, 0.0, {}, lambda: 0.0)
    finally:
        second.finish(None)


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
