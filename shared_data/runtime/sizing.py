"""Whether a config fits this machine: a command started on a config sized for a GPU, on a host
without one, says so before its first step, with the time a step takes here at the least and the
config to use instead (:func:`oversized_warning`).

The estimate is a lower bound: the config's model FLOPs per step (:func:`shared_data.model.unet_spec.
train_flops_per_sample` times the global batch) over this host's float32 matrix-multiply rate,
measured by :func:`host_gflops` in a fraction of a second. A 3-D convolution under XLA on a CPU runs
below that rate, so a step takes longer than the estimate, never shorter.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import subprocess
import time

from shared_data.core import config as config_mod
from shared_data.core import loader_kinds
from shared_data.core.config import Config
from shared_data.core.errors import ConfigError
from shared_data.model import unet_spec

log = logging.getLogger("dlas")

#: A step estimated to take at least this many seconds makes the command say so before it starts.
SLOW_STEP_SEC = 5.0
#: A rate below any host's (GFLOP/s): a step that takes less than SLOW_STEP_SEC even at it is not measured.
SLOWEST_HOST_GFLOPS = 5.0
#: The configs sized for a CPU, named as the ones to use instead.
CPU_CONFIGS = ("cpu_default", "cpu_tiny")
#: The most validation steps an epoch may hold: every step's crops are planned before the steps are
#: compiled (about 70 microseconds a step on one core: 7 s at this bound).
MAX_VAL_STEPS = 10**5


def gpu_visible() -> bool:
    """An NVIDIA GPU is visible to this process: ``nvidia-smi -L`` lists one, ``CUDA_VISIBLE_DEVICES``
    does not hide them all and ``JAX_PLATFORMS`` does not restrict JAX to the CPU. Asked without
    starting a framework."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or os.environ.get("JAX_PLATFORMS") == "cpu":
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


@functools.cache
def host_gflops(seconds: float = 0.2, side: int = 512) -> float:
    """This host's float32 matrix-multiply rate in GFLOP/s (2 side^3 FLOPs per product, NumPy's BLAS
    on every core), the best of three ``seconds``-long runs; measured once per process."""
    import numpy as np

    a = np.random.default_rng(0).random((side, side), dtype=np.float32)
    a @ a
    best = 0.0
    for _ in range(3):
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            a @ a
            n += 1
        best = max(best, 2.0 * side**3 * n / (time.perf_counter() - t0) / 1e9)
    return best


def step_seconds_at_least(cfg: Config, gflops: float) -> float:
    """The seconds of one training step of ``cfg``'s global batch at ``gflops`` GFLOP/s: the model
    FLOPs per step over that rate."""
    return unet_spec.train_flops_per_sample(cfg) * cfg.global_batch_size / (gflops * 1e9)


def validation_steps(cfg: Config, replicas: int) -> int:
    """The validation steps of an epoch of ``cfg`` on ``replicas`` (``Nsamples_val`` crops in global
    batches), said in one line before the crops are planned and the steps compiled.

    Raises:
        ConfigError: more than :data:`MAX_VAL_STEPS` steps.
    """
    global_bs, _ = config_mod.batch_sizes(cfg, replicas)
    steps = config_mod.val_steps(cfg, replicas)
    if steps > MAX_VAL_STEPS:
        raise ConfigError(
            f"config {cfg.name!r} key 'Nsamples_val': {cfg.Nsamples_val} crops in batches of {global_bs} are "
            f"{steps} validation steps an epoch; expected at most {MAX_VAL_STEPS} (each step's crops are planned "
            f"before compiling)"
        )
    source = cfg.data_file("val").name if loader_kinds.loader_kind(cfg).uses_files else "synthetic data"
    log.info(
        "validation: %d crops of %s each epoch (the same ones), %d steps of %d",
        cfg.Nsamples_val,
        source,
        steps,
        global_bs,
    )
    return steps


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def oversized_warning(
    cfg: Config, steps: int, what: str, gpu: bool | None = None, epoch_steps: int | None = None
) -> str | None:
    """The warning a command of ``steps`` training steps on ``cfg`` (``what``: "training", "the
    benchmark", ...) gives on a host without a GPU when a step takes at least
    :data:`SLOW_STEP_SEC`: the estimated seconds per step and in all, and the CPU configs to use
    instead; None on a GPU host (``gpu``: default :func:`gpu_visible`) or for a config that fits
    (one that fits even at :data:`SLOWEST_HOST_GFLOPS` is not measured). For a training run of
    ``epoch_steps`` steps an epoch with a time-to-quality budget (``quality_every_epochs`` and
    ``quality_budget_sec`` set), the run ends at the first epoch end past the budget, so "in all" counts
    the epochs up to that one."""
    if step_seconds_at_least(cfg, SLOWEST_HOST_GFLOPS) < SLOW_STEP_SEC or (gpu_visible() if gpu is None else gpu):
        return None
    rate = host_gflops()
    per_step = step_seconds_at_least(cfg, rate)
    if per_step < SLOW_STEP_SEC:
        return None
    flop = unet_spec.train_flops_per_sample(cfg) * cfg.global_batch_size
    counted = f"{steps} steps"
    budget = cfg.quality_budget_sec if cfg.quality_every_epochs else 0.0
    if epoch_steps and budget:
        epochs = math.floor(budget / (per_step * epoch_steps)) + 1  # the first epoch end past the budget
        if epochs * epoch_steps < steps:
            steps = epochs * epoch_steps
            counted += f"; its quality budget of {budget:g} s ends it at the first epoch end past it, after {steps}"
    return (
        f"config {cfg.name!r} is sized for a GPU ({flop / 1e12:.2f} TFLOP per step of {cfg.global_batch_size} "
        f"{cfg.crop_size}^3 crops) and no GPU is visible: on this CPU ({rate:.0f} GFLOP/s float32 matmul) a step "
        f"takes at least {_duration(per_step)}, {what} ({counted}) at least {_duration(per_step * steps)}. "
        f"On a CPU use --config {CPU_CONFIGS[0]} (or {CPU_CONFIGS[1]}); Ctrl-C stops"
    )
