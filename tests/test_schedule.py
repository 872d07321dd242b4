import math

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.model import schedule


def test_scaling_rules():
    cfg = config_mod.load_config("base", overrides={"start_lr": 1e-3, "base_batch_size": 64})
    assert schedule.initial_lr(cfg, 256) == 1e-3
    assert math.isclose(schedule.initial_lr(config_mod.replace(cfg, lr_scaling="sqrt"), 256), 2e-3)
    assert math.isclose(schedule.initial_lr(config_mod.replace(cfg, lr_scaling="linear"), 256), 4e-3)


def test_warmup_then_cosine_hand_values():
    cfg = config_mod.load_config(
        "base",
        overrides={"start_lr": 1.0, "end_lr": 0.0, "lr_scaling": "linear", "base_batch_size": 64, "warmup_steps": 4},
    )
    table = schedule.lr_table(cfg, 128, 12)  # peak 2.0, 4 warm-up steps, 8 cosine steps
    np.testing.assert_allclose(table[:4], [0.5, 1.0, 1.5, 2.0])
    # step 4 starts the cosine at the peak; step 8 is half way: end + (peak-end)/2 = 1.0
    np.testing.assert_allclose(table[4], 2.0)
    np.testing.assert_allclose(table[8], 1.0, atol=1e-6)
    np.testing.assert_allclose(table[11], 0.5 * 2.0 * (1 + math.cos(math.pi * 7 / 8)), rtol=1e-6)
    assert table.dtype == np.float32


def test_no_warmup_at_base_batch_and_constant_schedule():
    cfg = config_mod.load_config("base", overrides={"start_lr": 1.0, "warmup_steps": 10, "lr_schedule": "constant"})
    assert schedule.warmup_steps(cfg, 64) == 0
    np.testing.assert_allclose(schedule.lr_table(cfg, 64, 5), np.ones(5))


def test_a_learning_rate_beyond_float32_is_a_config_error():
    """start_lr just below float32's largest value, scaled by sqrt(G / B0) > 1, would be inf in the table."""
    cfg = config_mod.replace(config_mod.load_config("cpu_tiny"), start_lr=3.4e38, lr_scaling="sqrt", base_batch_size=1)
    with pytest.raises(config_mod.ConfigError, match=r"key.*'start_lr'.*beyond float32's range"):
        schedule.lr_table(cfg, 4, 10)
    assert np.isfinite(schedule.lr_table(config_mod.replace(cfg, start_lr=1e30), 4, 10)).all()
