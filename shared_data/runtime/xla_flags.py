"""The XLA flags this kit sets by default, in one place, for both frameworks.

``apply_default_xla_flags()`` runs when :mod:`jax_impl` or :mod:`tf_impl` is imported, before either
framework starts its XLA backend; the trainers log the resulting ``XLA_FLAGS``. A flag the user has
already named in ``XLA_FLAGS`` (with any value) is left alone, so ``XLA_FLAGS=--xla_gpu_force_conv_nhwc=false``
opts out.

* ``--xla_gpu_force_conv_nhwc=true``: every cuDNN convolution in NHWC (channels-last) layout.
  Without it XLA's layout assignment leaves some 3-D convolutions (or their gradients) in a
  channels-first layout with transposes around them, the effect ``channels_last_3d`` removes in
  PyTorch; ``experiments/perf_notes.md`` has the measured difference. It changes layouts only, not the
  arithmetic. GPU-only: the CPU backend ignores it.

TensorFlow adds :data:`TF_DEFAULT_XLA_FLAGS` (``apply_default_xla_flags(framework="tf")``):

* ``--xla_gpu_experimental_enable_fusion_autotuner=false``: TensorFlow's XLA runs a second autotuning
  pass over the step's fusions, which lengthens its cold compile by about a third at the same step
  (``experiments/tf_compile_flags`` has the measurements); without it the fusions keep the emitters
  XLA's heuristics pick. JAX's XLA parses the flag too, so in a process that imports both packages
  JAX also compiles without the pass.

Each of :data:`DEFAULT_XLA_FLAGS` is a boolean switch written ``--name=true``, so
:func:`default_xla_flags_off` can name each one ``=false`` for a JAX run without them (the ladder's
rungs before compilation).

The persistent compilation caches (JAX's ``JAX_COMPILATION_CACHE_DIR``, TF's
``--tf_xla_persistent_cache_directory`` in ``TF_XLA_FLAGS``, else the config's ``xla_cache_dir``) are
optional: a folder that cannot be written (read-only, under a file) is named in one warning and the
run compiles without a cache (:func:`writable_cache`), instead of TensorFlow failing the first step.

Where ``XLA_FLAGS`` gives the CPU platform several devices (``--xla_force_host_platform_device_count``
> 1, as the tests' data-parallel runs on CPU do), :data:`MULTI_CPU_DEVICE_XLA_FLAGS` are added too:

* ``--xla_cpu_multi_thread_eigen=false``: XLA's CPU FFT runs ducc's parallel transform on XLA's
  Eigen intra-op thread pool, and with two host devices running it at once the pool can wedge: one
  device never reaches the next collective and the other waits for it forever (the JAX trainer with
  ``lambda_fourier`` > 0 hung so on 2 CPU devices in about half the runs). Single-threaded Eigen
  removes the shared pool from the FFT. A second stall belongs to XLA's CPU client, with or
  without an FFT: a loop that dispatches dozens of programs without waiting for one can abort at
  XLA's 40-s rendezvous, one device in a collective and the other's launch waiting for a slot of
  its 32 in-flight programs (seen with three such processes at once on 2 cores, in 7 of 36 runs;
  none in 84 runs that waited for each step's result). The trainers wait for a step at least
  ``WAIT_SAMPLES`` (32) times an epoch (:class:`shared_data.runtime.steps.EpochTiming`).
  On 2 cores JAX's CPU train step runs as fast without the
  pool; TF's XLA step on CPU, which reads the same ``XLA_FLAGS`` in a process that imported
  :mod:`jax_impl`, ran 19% slower in one measurement, so the flag stays off for a single device.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger("dlas")

DEFAULT_XLA_FLAGS = ("--xla_gpu_force_conv_nhwc=true",)
TF_DEFAULT_XLA_FLAGS = ("--xla_gpu_experimental_enable_fusion_autotuner=false",)
MULTI_CPU_DEVICE_XLA_FLAGS = ("--xla_cpu_multi_thread_eigen=false",)


def host_device_count(flags: str) -> int:
    """The CPU platform's device count an ``XLA_FLAGS`` value asks for (1 where it names none)."""
    found = re.findall(r"--xla_force_host_platform_device_count=(\d+)", flags)
    return int(found[-1]) if found else 1


def kit_xla_flags(framework: str = "jax") -> tuple[str, ...]:
    """The kit's default XLA flags for ``framework`` ("jax" or "tf"): :data:`DEFAULT_XLA_FLAGS`, and
    for TensorFlow :data:`TF_DEFAULT_XLA_FLAGS` after them.

    Raises:
        ValueError: ``framework`` is neither "jax" nor "tf".
    """
    if framework not in ("jax", "tf"):
        raise ValueError(f"framework {framework!r}: expected 'jax' or 'tf'")
    return DEFAULT_XLA_FLAGS + (TF_DEFAULT_XLA_FLAGS if framework == "tf" else ())


def apply_default_xla_flags(environ: dict | None = None, framework: str = "jax") -> str:
    """Append each of :func:`kit_xla_flags` of ``framework`` (and :data:`MULTI_CPU_DEVICE_XLA_FLAGS`
    where the flags ask for several CPU devices) to ``environ["XLA_FLAGS"]`` (default ``os.environ``)
    unless the flag's name is already there; return the resulting value.

    Raises:
        ValueError: ``framework`` is neither "jax" nor "tf".
    """
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "")
    present = {item.split("=")[0] for item in flags.split()}
    wanted = kit_xla_flags(framework) + (MULTI_CPU_DEVICE_XLA_FLAGS if host_device_count(flags) > 1 else ())
    added = [f for f in wanted if f.split("=")[0] not in present]
    env["XLA_FLAGS"] = " ".join([flags.strip(), *added]).strip()
    return env["XLA_FLAGS"]


#: TensorFlow's flag (in ``TF_XLA_FLAGS``) that names its persistent compilation cache.
TF_CACHE_FLAG = "--tf_xla_persistent_cache_directory"


def tf_cache_folder(flags: str) -> str | None:
    """The folder a ``TF_XLA_FLAGS`` value names with ``--tf_xla_persistent_cache_directory=DIR``
    (the last one), else None."""
    found = re.findall(rf"(?:^|\s){TF_CACHE_FLAG}=(\S*)", flags)
    return found[-1] if found else None


def without_tf_cache(flags: str) -> str:
    """A ``TF_XLA_FLAGS`` value without its ``--tf_xla_persistent_cache_directory=...`` flags."""
    return " ".join(item for item in flags.split() if not item.startswith(TF_CACHE_FLAG + "="))


def writable_cache(folder: str | Path, source: str) -> bool:
    """Whether the persistent compilation cache ``folder`` (named by ``source``: an environment variable
    or the config key) can be written (:func:`shared_data.core.files.check_writable`, which makes
    nothing); if not, one warning names it and says the run compiles without a cache."""
    from shared_data.core.errors import UserError
    from shared_data.core.files import check_writable

    try:
        check_writable(folder, f"the compilation cache of {source}", folder=True)
    except UserError as err:
        log.warning("%s: this run compiles without a persistent compilation cache", err)
        return False
    return True


def default_xla_flags_off(flags: str = "") -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with each of :data:`DEFAULT_XLA_FLAGS` set to ``false``,
    XLA's own setting (JAX's rungs before compilation): a value of the flag already in ``flags`` is
    replaced, the other flags are kept in order."""
    off = {f.split("=")[0]: f.split("=")[0] + "=false" for f in DEFAULT_XLA_FLAGS}
    kept = [item for item in flags.split() if item.split("=")[0] not in off]
    return " ".join([*kept, *off.values()])
