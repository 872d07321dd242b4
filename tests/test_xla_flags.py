"""The default XLA flags: added once, never over a flag the user named, and set by importing either
framework package."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from shared_data.core.config import REPO_ROOT
from shared_data.runtime.xla_flags import (
    DEFAULT_XLA_FLAGS,
    apply_default_xla_flags,
    default_xla_flags_off,
    kit_xla_flags,
)


def test_defaults_are_appended_once_and_user_values_win():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    assert apply_default_xla_flags(env) == (
        "--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=true --xla_cpu_multi_thread_eigen=false"
    )
    assert apply_default_xla_flags(env) == env["XLA_FLAGS"]  # idempotent
    one = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    assert apply_default_xla_flags(one) == "--xla_force_host_platform_device_count=1 --xla_gpu_force_conv_nhwc=true"
    mine = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=true"}
    assert apply_default_xla_flags(mine).split()[1:] == [
        "--xla_cpu_multi_thread_eigen=true",
        "--xla_gpu_force_conv_nhwc=true",
    ]
    assert (
        apply_default_xla_flags({"XLA_FLAGS": "--xla_gpu_force_conv_nhwc=false"}) == "--xla_gpu_force_conv_nhwc=false"
    )
    assert apply_default_xla_flags({}) == " ".join(DEFAULT_XLA_FLAGS)


def test_tensorflow_adds_its_own_defaults_after_the_shared_ones():
    assert apply_default_xla_flags({}, framework="tf").split() == [
        "--xla_gpu_force_conv_nhwc=true",
        "--xla_gpu_experimental_enable_fusion_autotuner=false",
    ]
    mine = {"XLA_FLAGS": "--xla_gpu_experimental_enable_fusion_autotuner=true"}
    assert apply_default_xla_flags(mine, framework="tf").split() == [
        "--xla_gpu_experimental_enable_fusion_autotuner=true",
        "--xla_gpu_force_conv_nhwc=true",
    ]
    assert kit_xla_flags("jax") == DEFAULT_XLA_FLAGS
    with pytest.raises(ValueError, match="'torch'"):
        kit_xla_flags("torch")


def test_defaults_off_names_each_default_false_and_keeps_the_rest():
    assert default_xla_flags_off() == "--xla_gpu_force_conv_nhwc=false"
    assert (
        default_xla_flags_off("--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=true")
        == "--xla_force_host_platform_device_count=2 --xla_gpu_force_conv_nhwc=false"
    )
    env = {"XLA_FLAGS": default_xla_flags_off("--xla_cpu_enable_fast_math=false")}
    assert apply_default_xla_flags(env) == "--xla_cpu_enable_fast_math=false --xla_gpu_force_conv_nhwc=false"


def run_python(code: str, xla_flags: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python from the checkout's root with only ``PATH`` and ``XLA_FLAGS`` set;
    asserts it exits 0 (killed after 120 s: a hang fails)."""
    env = {"PATH": "/usr/bin:/bin", "XLA_FLAGS": xla_flags}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120, env=env
    )
    assert res.returncode == 0, res.stderr[-1500:]
    return res


def test_importing_jax_impl_sets_them_before_jax_starts():
    code = "import jax_impl, os, jax; jax.devices(); print(os.environ['XLA_FLAGS'])"
    res = run_python(code, "--xla_cpu_enable_fast_math=false")
    assert res.stdout.split() == ["--xla_cpu_enable_fast_math=false", "--xla_gpu_force_conv_nhwc=true"]


def test_importing_tf_impl_sets_them_and_tensorflow_xla_accepts_them():
    """The flags tf_impl adds parse in TensorFlow's XLA (an unknown flag aborts the process at the
    first compilation) and a jit-compiled function gives the float64 NumPy value."""
    code = (
        "import tf_impl, os, tensorflow as tf; "
        "f = tf.function(lambda x: tf.reduce_sum(x * x), jit_compile=True); "
        "print(os.environ['XLA_FLAGS'], float(f(tf.constant([0.5, 1.5, 2.0]))))"
    )
    out = run_python(code, "--xla_cpu_enable_fast_math=false").stdout.split()
    assert out[:3] == ["--xla_cpu_enable_fast_math=false", *kit_xla_flags("tf")]
    assert float(out[3]) == np.sum(np.array([0.5, 1.5, 2.0]) ** 2)


FFT_STEPS = """
import jax_impl  # the kit's XLA flags, before JAX starts
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax_impl.loss import fourier_l1
mesh = Mesh(np.array(jax.devices()), ("data",))
x = jax.device_put(np.random.default_rng(0).random((4, 16, 16, 16, 5), np.float32), NamedSharding(mesh, P("data")))
step = jax.jit(jax.value_and_grad(lambda x: jnp.mean(fourier_l1(x))))
first = float(step(x)[0])
for _ in range(30):
    x = (x - 0.1 * step(x)[1]).block_until_ready()
print(len(jax.devices()), first)
"""


def test_the_fourier_loss_on_two_cpu_devices_does_not_hang():
    """Thirty sharded value-and-gradient steps of the Fourier L1 on 2 CPU devices finish (with XLA's
    multithreaded Eigen pool they wedge in the FFT in most runs), and the first value is the float64
    NumPy mean of |rfftn(x, norm="ortho")| over the modes and channels. Each step is waited for, as
    the trainers do (:mod:`shared_data.runtime.xla_flags` says why)."""
    devices, first = run_python(FFT_STEPS, "--xla_force_host_platform_device_count=2").stdout.split()
    x = np.random.default_rng(0).random((4, 16, 16, 16, 5), np.float32).astype(np.float64)
    want = np.abs(np.fft.rfftn(x, axes=(1, 2, 3), norm="ortho")).mean()
    assert devices == "2" and abs(float(first) - want) < 1e-5 * want
