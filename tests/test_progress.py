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
    """One line per stage, each N-body step, the particle deposit (the longest) after each quarter of
    its 8 sub-lattices; a file that exists is said to be generated again before the work starts; the
    Zel'dovich dark matter's stages are its own."""
    assert generate.main(["--out", str(tmp_path / "v.h5"), "--size", "16", "--box", "4"]) == 0
    out, err = capsys.readouterr()
    a = ["0.050", "0.078", "0.107", "0.135", "0.163", "0.192", "0.220", "0.248", "0.277", "0.305", "0.333"]
    steps = [f"N-body step {i + 1} of 10 (a = {a[i]} -> {a[i + 1]}, 16^3 force mesh)" for i in range(10)]
    deposit = [
        "dark matter on the grid (2^3 particles per cell, TSC)",
        "dark matter on the grid: 2 of 8 sub-lattices deposited",
        "dark matter on the grid: 4 of 8 sub-lattices deposited",
        "dark matter on the grid: 6 of 8 sub-lattices deposited",
    ]
    nonlinear = "gas: shock heating, two-phase temperature, temperature-dependent Jeans smoothing"
    stages = ["Gaussian random field", *steps, "particle deformation: folded elements, shear", *deposit, nonlinear]
    assert err.splitlines() == [f"[generate] v.h5, 16^3: {stage}" for stage in [*stages, "writing"]]
    assert "exists" not in out
    again = ["--out", str(tmp_path / "v.h5"), "--size", "16", "--box", "4", "--workers", "2"]
    assert generate.main(again) == 0  # the pool's results are reported as they are summed
    out, err = capsys.readouterr()
    assert (
        out.splitlines()[0] == f"{tmp_path / 'v.h5'} exists: generating it again (--if-missing keeps an existing file)"
    )
    assert "[generate] v.h5, 16^3: dark matter on the grid: 6 of 8 sub-lattices deposited" in err.splitlines()
    # the Zel'dovich dark matter of generator v4: no N-body, the linear deformation tensor
    assert generate.main(["--out", str(tmp_path / "z.h5"), "--size", "16", "--box", "4", "--dm", "zeldovich"]) == 0
    zeldovich = ["Zel'dovich displacements", "deformation tensor: shell crossing, shock temperature, shear"]
    stages = ["Gaussian random field", *zeldovich, *deposit, nonlinear, "writing"]
    assert capsys.readouterr().err.splitlines() == [f"[generate] z.h5, 16^3: {stage}" for stage in stages]
    # the linear gas of generator v2 has no deformation stage
    assert generate.main(["--out", str(tmp_path / "f.h5"), "--size", "16", "--box", "4", "--gas", "filtered"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[11] == "[generate] f.h5, 16^3: dark matter on the grid (2^3 particles per cell, TSC)"
    assert err[15] == "[generate] f.h5, 16^3: gas: Jeans smoothing, temperature-density relation"
    assert not any("deformation" in line for line in err)


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
