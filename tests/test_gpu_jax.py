"""Correctness on a GPU (JAX + DALI): the 48 symmetries through DALI's GPU operators in every DALI mode
(``dali-npy``, ``dali-h5``, ``dali-device`` with JAX's GPU crop function) and the JAX ``device``
loader equal the NumPy reader bit for bit; the sub-pixel up-conv and space-to-depth down-conv equal
the float64 references at HIGHEST precision.

Marked ``gpu``: skipped where there is no GPU (CI); the GPU machine runs them with ``pytest -m gpu``.
The same checks on CPU are ``test_dali.py`` and ``test_jax_model.py``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data.sampler import TRAIN, Draws
from shared_data.model import unet_spec

pytestmark = pytest.mark.gpu


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def gpu_cfg(tiny_cfg):
    """The session's tiny data, one batch of 48 crops (every symmetry once)."""
    return config_mod.replace(tiny_cfg, global_batch_size=48, Nsamples=96)


@pytest.fixture(scope="module")
def symmetry_batch(gpu_cfg):
    """The 48 symmetries of one crop, as draws, their plan and the NumPy reader's batch."""
    reader = crop_readers.H5LowMemReader(gpu_cfg.data_file("train"), 4, 5, gpu_cfg.crop_size)
    start = np.array([[3, 70, 111]]) % (reader.size - gpu_cfg.crop_size + 1)
    draws = Draws(np.tile(start, (48, 1)), np.arange(48))
    plan = host_batches.EpochPlan([draws], [np.ones(48, np.float32)])
    return reader, plan, crop_readers.make_batch(reader, draws, gpu_cfg)


@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5", "dali-device"])
def test_dali_gpu_operators_equal_the_numpy_reader(kind, gpu_cfg, symmetry_batch):
    pytest.importorskip("nvidia.dali")
    from shared_data.data import dali_pipelines

    from jax_impl.dali import crop_fns

    reader, plan, (want_x, want_y) = symmetry_batch
    cfg = config_mod.replace(gpu_cfg, data_loader_config=kind, dali_h5_mode="simple")
    path = cfg.data_file("train")
    plans = dali_pipelines.EpochPlans(cfg, TRAIN, [0], 1, reader.size)
    plans._cache = {0: plan}
    sources = None
    if kind == "dali-h5":
        sources = dali_pipelines.crop_sources(plans, path, cfg)
    elif kind == "dali-device":
        fns = crop_fns(dali_pipelines.load_volumes(path, cfg), 0, cfg.crop_size)
        sources = dali_pipelines.device_crop_sources(plans, fns, cfg)
    pipe = dali_pipelines.build_pipeline(cfg, "train", 48, 0, plans, sources)
    pipe.build()
    x, y, _ = (t.as_cpu().as_array() for t in pipe.run())
    assert np.array_equal(_bits(x), _bits(want_x)) and np.array_equal(_bits(y), _bits(want_y))


def test_jax_device_loader_equals_the_numpy_reader(gpu_cfg):
    import jax

    from jax_impl import data as data_mod
    from jax_impl import distribute

    mesh = distribute.make_mesh(1)
    device = data_mod.make_input(config_mod.replace(gpu_cfg, data_loader_config="device"), "train", mesh)
    native = data_mod.make_input(config_mod.replace(gpu_cfg, data_loader_config="inmem"), "train", mesh)
    cut = jax.jit(functools.partial(data_mod.crops, cfg=device.cfg))  # the crop plan, cut as the step cuts it
    for plan, b in zip(device.epoch(0), native.epoch(0)):
        a = cut(plan)
        for key in ("inputs", "targets", "mask"):
            assert np.array_equal(_bits(a[key]), _bits(b[key])), key


@pytest.mark.parametrize(("n", "c_in", "c_out"), [(2, 64, 32), (16, 32, 16)])
def test_gpu_convolutions_equal_the_float64_references(n, c_in, c_out):
    import jax
    import jax.numpy as jnp

    from jax_impl import model as model_mod

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, n, n, n, c_in)).astype(np.float32)
    w = rng.standard_normal((4, 4, 4, c_in, c_out)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        up = np.asarray(jax.jit(model_mod.conv_transpose_subpixel)(jnp.asarray(x), jnp.asarray(w)), np.float64)
        down = np.asarray(jax.jit(model_mod.conv_space_to_depth)(jnp.asarray(x), jnp.asarray(w)), np.float64)
    for got, ref in ((up, unet_spec.conv_transpose_reference(x, w)), (down, unet_spec.conv_reference(x, w))):
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
