import math

import numpy as np

from shared_data import config as C
from shared_data import schedule


def test_scaling_rules():
    cfg = C.load_config("base", overrides={"start_lr": 1e-3, "base_batch_size": 64})
    assert schedule.initial_lr(cfg, 256) == 1e-3
    assert math.isclose(schedule.initial_lr(C.replace(cfg, lr_scaling="sqrt"), 256), 2e-3)
    assert math.isclose(schedule.initial_lr(C.replace(cfg, lr_scaling="linear"), 256), 4e-3)


def test_warmup_then_cosine_hand_values():
    cfg = C.load_config(
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
    cfg = C.load_config("base", overrides={"start_lr": 1.0, "warmup_steps": 10, "lr_schedule": "constant"})
    assert schedule.warmup_steps(cfg, 64) == 0
    np.testing.assert_allclose(schedule.lr_table(cfg, 64, 5), np.ones(5))
