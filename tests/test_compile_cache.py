"""TensorFlow's persistent compilation cache is written where the run says (``<xla_cache_dir>/tf``),
a resumed run with nothing left to train compiles nothing (both frameworks), and a new run that reads
the cache prints no C++ error line."""

from __future__ import annotations

import os
import re

import pytest
from conftest import run_in_process, run_module


@pytest.mark.slow
@pytest.mark.parametrize("fw", ["tf_impl"])  # JAX: tests/test_entry_points.py (a run of no epochs compiles nothing)
def test_the_cache_is_written_and_a_finished_run_resumed_compiles_nothing(fw, tmp_path, tiny_argv):
    argv = [f"{fw}.train", *tiny_argv, "--set", f"xla_cache_dir={tmp_path / 'xla'}", "--workdir", str(tmp_path / "w")]
    # a TF_XLA_FLAGS of the environment names its own cache and wins over the config: the config's here
    env = {k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"}
    first = run_module(*argv, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "compile: train step" in first.stdout + first.stderr
    if fw == "tf_impl":
        assert f"--tf_xla_persistent_cache_directory={tmp_path / 'xla' / 'tf'}" in first.stdout + first.stderr
        assert list((tmp_path / "xla" / "tf").glob("xla_compile_cache__*XLA_CPU_JIT.pb"))
    train = __import__(f"{fw}.train", fromlist=["main"])
    again = run_in_process(train.main, [*argv[1:], "--resume"])  # compiles nothing: no fresh process needed
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    assert "all 1 epochs of this run are trained: nothing to do" in out
    assert "compile:" not in out
    if fw == "tf_impl":  # a new run of the config compiles through a cache hit, where TF logs false errors
        hit = run_module(*argv, "--overwrite", env=env)
        assert hit.returncode == 0, hit.stderr[-3000:]
        assert "compile: train step" in hit.stdout
        assert not re.findall(r"^E\d{4} .*", hit.stderr, re.M)
