"""The processes of a run agree on the experiment before they train (shared_data.runtime.agreement):
digests of each config key and data file, compared across the processes."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys

import numpy as np
import pytest
from processes import process_env

from shared_data.core.config import REPO_ROOT
from shared_data.core.errors import UserError
from shared_data.runtime import agreement


def test_fingerprint_is_one_row_of_31_bit_digests_that_changes_with_a_shaping_key(tiny_cfg):
    names, texts, row = agreement.fingerprint(tiny_cfg)
    assert row.dtype == np.int32 and row.shape == (len(names),) == (len(texts),)
    assert (row >= 0).all()
    assert "start_lr" in names and "train_path" not in names and "data train_path" in names
    again = agreement.fingerprint(tiny_cfg)[2]
    assert (again == row).all()  # deterministic
    other = agreement.fingerprint(dataclasses.replace(tiny_cfg, start_lr=tiny_cfg.start_lr * 2))[2]
    assert [n for n, a, b in zip(names, row, other) if a != b] == ["start_lr"]
    moved = agreement.fingerprint(dataclasses.replace(tiny_cfg, xla_cache_dir="/elsewhere", progress_bar=False))[2]
    assert (moved == row).all()  # places and host-side tuning may differ between processes


def test_data_digest_names_the_bytes_not_the_path(tmp_path):
    a, b, c = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "c.h5"
    payload = bytes(range(256)) * 1024
    a.write_bytes(payload)
    b.write_bytes(payload)  # a copy at another path
    c.write_bytes(payload[:-1] + b"\x00")  # one byte at the end differs
    assert agreement.data_digest(a) == agreement.data_digest(b)
    assert agreement.data_digest(a).startswith("262144 bytes, crc32 ")
    assert agreement.data_digest(a) != agreement.data_digest(c)
    assert agreement.data_digest(tmp_path / "none.h5") == "missing"


def test_check_names_the_first_key_that_differs_and_the_processes_on_each_side():
    names, texts = ["a", "b", "c"], ["1", "2", "3"]
    same = np.array([[1, 2, 3]] * 3, np.int32)
    agreement.check(names, texts, same, rank=1)  # no difference: nothing raised
    rows = same.copy()
    rows[2, 1], rows[2, 2] = 9, 9
    with pytest.raises(UserError) as err:
        agreement.check(names, texts, rows, rank=0)
    assert str(err.value) == (
        "the processes of this run disagree on b: processes 0, 1 (this one: 0) 2, process 2 another value; "
        "start every process with the same config and data"
    )
    with pytest.raises(UserError, match="every process must run the same version of the kit"):
        agreement.check(names, texts, same[:, :2], rank=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "tf"])
def test_two_processes_with_another_learning_rate_refuse_to_start(framework, tiny_argv, tmp_path):
    """Two processes of one run, one with another ``start_lr``: both end before training with the
    line naming the key, exit code 2, no traceback and no run folder."""
    ports = [_free_port(), _free_port()]
    procs = []
    for rank, lr in enumerate(("2e-4", "5e-4")):
        env = process_env(framework, rank, ports)
        cmd = [sys.executable, "-m", f"{framework}_impl.train", *tiny_argv, "--set", f"start_lr={lr}"]
        cmd += ["--workdir", str(tmp_path / "run")]
        procs.append(
            subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = [p.communicate(timeout=240) for p in procs]
    for rank, (proc, (_, err)) in enumerate(zip(procs, results)):
        assert proc.returncode == 2, (rank, proc.returncode, err[-3000:])
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1, err[-3000:]
        assert "the processes of this run disagree on start_lr" in errors[0], errors
        assert f"process {rank} (this one) {('0.0002', '0.0005')[rank]}" in errors[0], errors
        assert "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "run").exists()
