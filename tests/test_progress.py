"""Long work says what it is doing: the generator one line per stage, the benchmark (and the trainers'
``--enable_benchy``, which runs it) one line per stage of each mode, windowed prediction a progress bar
that appears on a terminal and stays out of logs."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from dlas_compare import benchmark
from shared_data.data import generate
from shared_data.inference import tiling


def test_generate_says_each_stage(tmp_path, capsys):
    """One line per stage, the particle deposit (the longest) after each quarter of its 8 sub-lattices;
    a file that exists is said to be generated again before the work starts."""
    assert generate.main(["--out", str(tmp_path / "v.h5"), "--size", "16", "--box", "4"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "[generate] v.h5, 16^3: Gaussian random field",
        "[generate] v.h5, 16^3: Zel'dovich displacements",
        "[generate] v.h5, 16^3: deformation tensor: shell crossing, shock temperature, shear",
        "[generate] v.h5, 16^3: dark matter on the grid (2^3 particles per cell, TSC)",
        "[generate] v.h5, 16^3: dark matter on the grid: 2 of 8 sub-lattices deposited",
        "[generate] v.h5, 16^3: dark matter on the grid: 4 of 8 sub-lattices deposited",
        "[generate] v.h5, 16^3: dark matter on the grid: 6 of 8 sub-lattices deposited",
        "[generate] v.h5, 16^3: gas: shock heating, two-phase temperature, temperature-dependent Jeans smoothing",
        "[generate] v.h5, 16^3: writing",
    ]
    assert "exists" not in out
    again = ["--out", str(tmp_path / "v.h5"), "--size", "16", "--box", "4", "--workers", "2"]
    assert generate.main(again) == 0  # the pool's results are reported as they are summed
    out, err = capsys.readouterr()
    assert (
        out.splitlines()[0] == f"{tmp_path / 'v.h5'} exists: generating it again (--if-missing keeps an existing file)"
    )
    assert "[generate] v.h5, 16^3: dark matter on the grid: 6 of 8 sub-lattices deposited" in err.splitlines()
    # the linear gas of generator v2 has no deformation-tensor stage
    assert generate.main(["--out", str(tmp_path / "f.h5"), "--size", "16", "--box", "4", "--gas", "filtered"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[2] == "[generate] f.h5, 16^3: dark matter on the grid (2^3 particles per cell, TSC)"
    assert err[6] == "[generate] f.h5, 16^3: gas: Jeans smoothing, temperature-density relation"


@pytest.mark.slow
def test_benchmark_says_each_stage(tiny_argv, capsys):
    argv = [*tiny_argv, "--mode", "io", "synthetic", "--warmup", "0", "--steps", "1", "--windows", "1"]
    assert benchmark.main(argv) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[benchmark]")]
    lines = [line.split(";")[0] for line in said]
    # SYNTHETIC first (its step is what FULL reuses), then IO on its own pipeline
    assert lines[0] == "[benchmark] jax synthetic: setting up (one cached batch, batch 4)"
    assert re.fullmatch(r"\[benchmark\] jax synthetic: jax imported in \d+\.\d s", lines[1]), lines[1]
    assert said[1].endswith("; building the model and compiling its train step")
    assert lines[2].startswith("[benchmark] jax synthetic: step compiled in ")
    assert lines[4] == "[benchmark] jax io: setting up (lowmem loader, batch 4)"
    assert lines[5] == "[benchmark] jax io: input pipeline ready"
    assert lines[3].endswith(" samples/s") and lines[6].endswith(" samples/s") and len(lines) == 7


def test_windowed_prediction_shows_progress_on_a_terminal_only(capsys, monkeypatch):
    x = np.zeros((16, 16, 16, 4), np.float32)
    apply = lambda batch: np.zeros((*batch.shape[:4], 5), np.float32)
    n = len(tiling.tile_plan(16, 8, 2, 4))
    for terminal in (False, True):
        monkeypatch.setattr(sys.stderr, "isatty", lambda t=terminal: t)
        out, tiles = tiling.predict_volume(x, apply, 5, 8, 2, 4, batch_size=2, progress=True)
        err = capsys.readouterr().err
        assert tiles == n > 1 and out.shape == (16, 16, 16, 5)
        if terminal:
            assert f"{n} windows, batches of 2" in err and f"0/{(n + 1) // 2}" in err
        else:
            assert err == ""
