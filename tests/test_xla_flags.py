"""The default XLA flags: added once, never over a flag the user named, and set by importing either
framework package."""

from __future__ import annotations

import subprocess
import sys

from shared_data.core.config import REPO_ROOT
from shared_data.runtime.xla_flags import DEFAULT_XLA_FLAGS, apply_default_xla_flags, default_xla_flags_off


def test_defaults_are_appended_once_and_user_values_win():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert apply_default_xla_flags(env) == "--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=true"
    assert apply_default_xla_flags(env) == env["XLA_FLAGS"]  # idempotent
    assert (
        apply_default_xla_flags({"XLA_FLAGS": "--xla_gpu_force_conv_nhwc=false"}) == "--xla_gpu_force_conv_nhwc=false"
    )
    assert apply_default_xla_flags({}) == " ".join(DEFAULT_XLA_FLAGS)


def test_defaults_off_names_each_default_false_and_keeps_the_rest():
    assert default_xla_flags_off() == "--xla_gpu_force_conv_nhwc=false"
    assert (
        default_xla_flags_off("--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=true")
        == "--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=false"
    )
    env = {"XLA_FLAGS": default_xla_flags_off("--xla_cpu_enable_fast_math=false")}
    assert apply_default_xla_flags(env) == "--xla_cpu_enable_fast_math=false --xla_gpu_force_conv_nhwc=false"


def test_importing_jax_impl_sets_them_before_jax_starts():
    code = "import jax_impl, os, jax; jax.devices(); print(os.environ['XLA_FLAGS'])"
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "XLA_FLAGS": "--xla_cpu_enable_fast_math=false"},
    )
    assert res.returncode == 0, res.stderr[-1500:]
    assert res.stdout.split() == ["--xla_cpu_enable_fast_math=false", "--xla_gpu_force_conv_nhwc=true"]
