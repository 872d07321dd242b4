"""TensorFlow's ``device`` loader: crops and symmetries gathered from the device-resident volume
equal the NumPy loader's batches bit for bit (two replicas: tests/test_distributed.py)."""

from __future__ import annotations

import numpy as np

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
            got, want = list(dev.epoch(epoch)), list(native.epoch(epoch))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(g[k].numpy(), w[k].numpy(), err_msg=f"{split} {epoch} {k}")
    assert w["mask"].numpy().tolist() == [1, 1, 0, 0]
    assert len(set(data_mod.make_input(cfg, "train", strategy).plan(0).draws[0].symmetries.tolist())) > 1
