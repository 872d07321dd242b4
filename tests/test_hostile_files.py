"""Hostile files, round 3: outputs in read-only or misplaced places and records that cannot be read
end in one ``error:`` line naming the path and what is wrong (or, where the output is optional, one
warning and the run goes on), before any work where that is possible."""

from __future__ import annotations

import pytest
from conftest import assert_one_error_line, read_only, run_in_process

from dlas_compare import doctor


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
