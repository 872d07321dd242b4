"""Shared fixtures: tiny generated dataset files and the tiny config that points at them."""

from __future__ import annotations

import os
import shutil
import subprocess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # 2 CPU devices for JAX sharding tests

import pytest

from shared_data.core import config as config_mod
from shared_data.data import generate


def _generate(path, size, seed):
    args = generate.build_parser().parse_args(
        ["--out", str(path), "--size", str(size), "--seed", str(seed), "--chunk", "16"]
    )
    args.box = 0.25 * size
    generate.generate(args)
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A folder with train_32.h5 (32^3, seed 1) and val_24.h5 (24^3, seed 2) and their .npy files."""
    d = tmp_path_factory.mktemp("data")
    _generate(d / "train_32.h5", 32, 1)
    _generate(d / "val_24.h5", 24, 2)
    from shared_data.data.convert import convert_to_npy

    convert_to_npy(d / "train_32.h5")
    convert_to_npy(d / "val_24.h5")
    return d


@pytest.fixture(scope="session")
def tiny_cfg(data_dir, tmp_path_factory):
    """``cpu_tiny`` pointed at the session's generated files, runs under a temporary exp_dir."""
    runs = tmp_path_factory.mktemp("runs")
    return config_mod.load_config(
        "cpu_tiny",
        overrides=dict(
            train_path=str(data_dir / "train_32.h5"),
            val_path=str(data_dir / "val_24.h5"),
            exp_dir=str(runs),
            xla_cache_dir=str(runs / "xla_cache"),
        ),
    )


@pytest.fixture(scope="session")
def tiny_argv(tiny_cfg):
    """The command-line arguments that select ``cpu_tiny`` on the session's data files and XLA cache
    (a later ``--set xla_cache_dir=...`` overrides the cache)."""
    return [
        "--config",
        "cpu_tiny",
        "--set",
        f"train_path={tiny_cfg.train_path}",
        "--set",
        f"val_path={tiny_cfg.val_path}",
        "--set",
        f"xla_cache_dir={tiny_cfg.xla_cache_dir}",
    ]


def _has_gpu() -> bool:
    """An NVIDIA GPU is visible (``nvidia-smi -L`` lists one); asked without starting a framework."""
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, with the reason, where there is no GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not _has_gpu():
        skip = pytest.mark.skip(reason="needs a GPU (the GPU machine runs them: pytest -m gpu)")
        for item in gpu_items:
            item.add_marker(skip)
