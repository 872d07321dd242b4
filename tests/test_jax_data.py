"""JAX's ``device`` loader: crops and symmetries gathered from the device-resident volume (by
``data.crops``, which the jitted steps call) equal the NumPy loader's batches bit for bit."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from shared_data.core import config as config_mod

from jax_impl import data as data_mod
from jax_impl import distribute


@pytest.mark.parametrize("num_devices", [1, 2])
def test_device_loader_matches_numpy_loader(tiny_cfg, num_devices):
    # Nsamples_val=6 with a global batch of 4: 2 validation steps, the last one half padding
    cfg = config_mod.replace(tiny_cfg, data_loader_config="device", Nsamples=12, Nsamples_val=6)
    mesh = distribute.make_mesh(num_devices)
    cut = jax.jit(functools.partial(data_mod.crops, cfg=cfg))
    for split in ("train", "val"):
        dev, native = (
            data_mod.make_input(cfg, split, mesh),
            data_mod.make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, mesh),
        )
        assert dev.steps == native.steps == (3 if split == "train" else 2)
        for epoch in (0, 1):
            got, want = [cut(b) for b in dev.epoch(epoch)], list(native.epoch(epoch))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                for k in ("inputs", "targets"):  # cut on each device from its part of the draws
                    assert g[k].sharding.is_equivalent_to(distribute.batch_sharding(mesh), 5), g[k].sharding
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(np.asarray(g[k]), np.asarray(w[k]), err_msg=f"{split} {epoch} {k}")
    assert np.asarray(w["mask"]).tolist() == [1, 1, 0, 0]
    # the training draws used several symmetries, so the axis and channel turns were exercised
    assert len(set(data_mod.make_input(cfg, "train", mesh).plan(0).draws[0].symmetries.tolist())) > 1


def test_the_jitted_step_cuts_the_device_loaders_crops(tiny_cfg):
    """The jitted train and eval steps fed a ``device`` loader's crop plan (volume, draws, mask) give
    the loss and weights of the same steps fed the crops cut outside them (by ``data.crops``)."""
    from jax_impl import model as model_mod
    from jax_impl import step as step_mod

    cfg = config_mod.replace(tiny_cfg, data_loader_config="device", Nsamples=12, Nsamples_val=6)
    mesh = distribute.make_mesh(1)
    train_in, val_in = (data_mod.make_input(cfg, split, mesh) for split in ("train", "val"))
    plan, val_plan = next(iter(train_in.epoch(0))), next(iter(val_in.epoch(0)))
    assert set(plan) == {"volume", "draws", "mask"} and plan["volume"].shape == (32**3, 9)
    model, tx = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, np.full(8, 1e-3, np.float32))
    results = []
    for train_batch, val_batch in ((plan, val_plan), (data_mod.crops(plan, cfg), data_mod.crops(val_plan, cfg))):
        state = step_mod.create_train_state(cfg, model_mod.init_params(cfg, 0), tx)
        specs = [distribute.abstract(b) for b in (train_batch, val_batch)]
        train_fn, eval_fn, _ = step_mod.compile_steps(cfg, model, tx, state, *specs)
        val = float(eval_fn(state.params, val_batch)["loss_sum"])
        state, metrics = train_fn(state, train_batch)
        results.append((float(metrics["loss"]), val, model_mod.params_to_canonical(jax.device_get(state.params))))
    (loss, val, weights), (want_loss, want_val, want_weights) = results
    assert loss == want_loss > 0 and val == want_val > 0
    for k in want_weights:
        np.testing.assert_array_equal(weights[k], want_weights[k], err_msg=k)
