"""JAX's ``device`` loader: crops and symmetries gathered from the device-resident volume equal
the NumPy loader's batches bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from jax_impl import data as data_mod
from jax_impl import distribute
from shared_data.core import config as config_mod


@pytest.mark.parametrize("num_devices", [1, 2])
def test_device_loader_matches_numpy_loader(tiny_cfg, num_devices):
    # Nsamples_val=6 with a global batch of 4: 2 validation steps, the last one half padding
    cfg = config_mod.replace(tiny_cfg, data_loader_config="device", Nsamples=12, Nsamples_val=6)
    mesh = distribute.make_mesh(num_devices)
    for split in ("train", "val"):
        dev, native = (
            data_mod.make_input(cfg, split, mesh),
            data_mod.make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, mesh),
        )
        assert dev.steps == native.steps == (3 if split == "train" else 2)
        for epoch in (0, 1):
            got, want = list(dev.epoch(epoch)), list(native.epoch(epoch))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert len(g["inputs"].sharding.device_set) == num_devices
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(np.asarray(g[k]), np.asarray(w[k]), err_msg=f"{split} {epoch} {k}")
    assert np.asarray(w["mask"]).tolist() == [1, 1, 0, 0]
    # the training draws used several symmetries, so the axis and channel turns were exercised
    assert len(set(data_mod.make_input(cfg, "train", mesh).plan(0).draws[0].symmetries.tolist())) > 1
