"""Correctness on the GPU machine (run there, JAX + DALI): the 48 symmetries through DALI's GPU
operators and the JAX ``device`` loader equal the NumPy reader bit for bit; the sub-pixel up-conv
and space-to-depth down-conv equal the float64 references at HIGHEST precision."""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_impl import data as D
from jax_impl import distribute
from jax_impl import model as M
from shared_data import config as C
from shared_data import dali_pipelines as dp
from shared_data import loader, readers, unet_spec
from shared_data.sampler import TRAIN, Draws

cfg = C.load_config("short_opt", overrides={"global_batch_size": 48, "Nsamples": 96})
path = cfg.data_file("train")
reader = readers.H5LowMemReader(path, 4, 5, 64)
ok = True

draws = Draws(np.tile(np.array([[3, 70, 111]]), (48, 1)), np.arange(48))
plan = loader.EpochPlan([draws], [np.ones(48, np.float32)])
plans = dp.EpochPlans(cfg, TRAIN, [0], 1, reader.size)
plans._cache = {0: plan}
pipe = dp.build_pipeline(C.replace(cfg, data_loader_config="dali-npy"), "train", 48, 0, plans)
pipe.build()
x, y, m = pipe.run()
x, y = np.asarray(x.as_cpu().as_array()), np.asarray(y.as_cpu().as_array())
rx, ry = readers.make_batch(reader, draws, cfg)
same = np.array_equal(x, rx) and np.array_equal(y, ry)
print("DALI GPU flip+rotate+coord_transform, 48 symmetries == NumPy:", same)
ok &= same

mesh = distribute.make_mesh(1)
dev, nat = (
    D.make_input(C.replace(cfg, data_loader_config="device"), "train", mesh),
    D.make_input(C.replace(cfg, data_loader_config="inmem"), "train", mesh),
)
same = all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for a, b in zip(dev.epoch(0), nat.epoch(0)) for k in a)
print("JAX device loader on GPU == NumPy reader:", same)
ok &= same

rng = np.random.default_rng(0)
with jax.default_matmul_precision("highest"):
    for n, ci, co in [(2, 64, 32), (16, 32, 16)]:
        xx = rng.standard_normal((2, n, n, n, ci)).astype(np.float32)
        w = rng.standard_normal((4, 4, 4, ci, co)).astype(np.float32)
        got = np.asarray(jax.jit(M.conv_transpose_subpixel)(jnp.asarray(xx), jnp.asarray(w)), np.float64)
        ref = unet_spec.conv_transpose_reference(xx, w)
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        got_d = np.asarray(jax.jit(M.conv_space_to_depth)(jnp.asarray(xx), jnp.asarray(w[..., :ci, :co])), np.float64)
        err_d = np.linalg.norm(got_d - unet_spec.conv_reference(xx, w)) / np.linalg.norm(
            unet_spec.conv_reference(xx, w)
        )
        print(f"GPU up-conv n={n}: rel err {err:.2e}; down-conv rel err {err_d:.2e}")
        ok &= err < 1e-5 and err_d < 1e-5
sys.exit(0 if ok else 1)
