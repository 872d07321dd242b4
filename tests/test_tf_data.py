"""TensorFlow's ``device`` loader: crops and symmetries gathered from the device-resident volume
(by ``data.crops``, which the steps call) equal the NumPy loader's batches bit for bit (two
replicas: tests/test_distributed.py)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from shared_data.core import config as config_mod

from tf_impl import data as data_mod
from tf_impl import distribute


def test_device_loader_matches_numpy_loader(tiny_cfg):
    # Nsamples_val=6 with a global batch of 4: 2 validation steps, the last one half padding
    cfg = config_mod.replace(tiny_cfg, data_loader_config="device", Nsamples=12, Nsamples_val=6)
    strategy = distribute.make_strategy()
    for split in ("train", "val"):
        dev, native = (
            data_mod.make_input(cfg, split, strategy),
            data_mod.make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, strategy),
        )
        assert isinstance(dev, data_mod.DeviceInput) and dev.steps == native.steps == (3 if split == "train" else 2)
        for epoch in (0, 1):
            got, want = [data_mod.crops(b, cfg) for b in dev.epoch(epoch)], list(native.epoch(epoch))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(g[k].numpy(), w[k].numpy(), err_msg=f"{split} {epoch} {k}")
    assert w["mask"].numpy().tolist() == [1, 1, 0, 0]
    assert len(set(data_mod.make_input(cfg, "train", strategy).plan(0).draws[0].symmetries.tolist())) > 1


def test_the_compiled_step_cuts_the_device_loaders_crops(tiny_cfg):
    """The XLA train and eval steps fed a ``device`` loader's crop plan (volume, draws, mask) give the
    loss and weights of the same steps fed the crops cut outside them (eagerly, by ``data.crops``)."""
    from shared_data.model import unet_spec

    from tf_impl import model as model_mod
    from tf_impl import step as step_mod

    cfg = config_mod.replace(tiny_cfg, data_loader_config="device", Nsamples=12, Nsamples_val=6)
    strategy = distribute.make_strategy()
    train_in, val_in = (data_mod.make_input(cfg, split, strategy) for split in ("train", "val"))
    plan, val_plan = next(iter(train_in.epoch(0))), next(iter(val_in.epoch(0)))
    assert set(plan) == {"volume", "draws", "mask"} and plan["volume"].shape == (32**3, 9)
    results = []
    for train_batch, val_batch in ((plan, val_plan), (data_mod.crops(plan, cfg), data_mod.crops(val_plan, cfg))):
        model = model_mod.build_model(cfg)
        opt = step_mod.make_optimizer(cfg, np.full(8, 1e-3, np.float32))
        model_mod.params_from_canonical(model, unet_spec.init_weights(cfg, 0))
        specs = [{k: tf.TensorSpec(v.shape, v.dtype) for k, v in b.items()} for b in (train_batch, val_batch)]
        train_fn, eval_fn, _ = step_mod.compile_steps(cfg, strategy, step_mod.TrainState(model, opt), *specs)
        loss = float(train_fn(train_batch)["loss"])
        results.append((loss, float(eval_fn(val_batch)["loss_sum"]), model_mod.params_to_canonical(model)))
    (loss, val, weights), (want_loss, want_val, want_weights) = results
    assert loss == want_loss > 0 and val == want_val > 0
    for k in want_weights:
        np.testing.assert_array_equal(weights[k], want_weights[k], err_msg=k)
