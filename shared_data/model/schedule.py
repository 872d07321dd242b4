"""The tutorial's learning-rate schedule, computed once as a table both frameworks index by step.

initial LR = start_lr x {1, sqrt(G / B0), G / B0} for ``lr_scaling`` none / sqrt / linear, with G the
global batch and B0 ``base_batch_size`` (Goyal et al. 2017, "Accurate, large minibatch SGD", for the
linear rule and the warm-up; Krizhevsky 2014 for the square-root rule). When G > B0 the LR rises
linearly over ``warmup_steps`` to that value; then it decays to ``end_lr`` by a half cosine over
the remaining steps (Loshchilov & Hutter 2017, SGDR, without restarts), or stays constant.
"""

from __future__ import annotations

import math

import numpy as np

from shared_data.core.config import Config
from shared_data.core.config_checks import MAX_TOTAL_STEPS
from shared_data.core.errors import ConfigError


def initial_lr(cfg: Config, global_batch: int) -> float:
    """Peak learning rate after batch-size scaling."""
    ratio = global_batch / cfg.base_batch_size
    factor = {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[cfg.lr_scaling]
    return cfg.start_lr * factor


def warmup_steps(cfg: Config, global_batch: int) -> int:
    """Warm-up length in steps: ``cfg.warmup_steps`` when the global batch exceeds the base, else 0."""
    return cfg.warmup_steps if global_batch > cfg.base_batch_size else 0


def learning_rate(step: int, cfg: Config, global_batch: int, total_steps: int) -> float:
    """LR used by optimizer step ``step`` (0-based) of a run of ``total_steps`` steps."""
    peak = initial_lr(cfg, global_batch)
    warm = warmup_steps(cfg, global_batch)
    if step < warm:
        return peak * (step + 1) / warm
    if cfg.lr_schedule == "constant":
        return peak
    t = min(step - warm, max(total_steps - warm, 1)) / max(total_steps - warm, 1)
    return cfg.end_lr + 0.5 * (peak - cfg.end_lr) * (1 + math.cos(math.pi * t))


def lr_table(cfg: Config, global_batch: int, total_steps: int) -> np.ndarray:
    """``learning_rate`` for steps 0 .. total_steps - 1 as float32 (at least one entry).

    Frameworks index it with the step clamped to the last entry, so both apply identical LRs.

    Raises:
        ConfigError: more than :data:`shared_data.core.config_checks.MAX_TOTAL_STEPS` steps (checked before
            the table is built); an LR beyond float32's range (``start_lr`` or ``end_lr`` near 3.4e38, or scaled
            there for this global batch).
    """
    if total_steps > MAX_TOTAL_STEPS:
        raise ConfigError(
            f"config {cfg.name!r} keys 'num_epochs' / 'Nsamples': {cfg.num_epochs} epochs of "
            f"{cfg.Nsamples} crops in batches of {global_batch} are {total_steps} optimizer steps; expected at "
            f"most {MAX_TOTAL_STEPS} (the learning-rate table holds one entry per step)"
        )
    n = max(total_steps, 1)
    table = [learning_rate(s, cfg, global_batch, total_steps) for s in range(n)]
    largest = max(table)
    if not largest <= float(np.finfo(np.float32).max):
        raise ConfigError(
            f"config {cfg.name!r} keys 'start_lr' / 'end_lr': start_lr {cfg.start_lr} (scaled to "
            f"{initial_lr(cfg, global_batch):.4g} for global batch {global_batch}) and end_lr {cfg.end_lr} give "
            f"a learning rate of {largest:.4g}, beyond float32's range; expected a finite learning rate"
        )
    return np.array(table, np.float32)
