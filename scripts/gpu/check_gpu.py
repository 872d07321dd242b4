"""Correctness on a GPU machine (JAX + DALI): the 48 symmetries through DALI's GPU operators in every
DALI mode (``dali-npy``, ``dali-h5``, ``dali-device`` with JAX's GPU crop function) and the JAX
``device`` loader equal the NumPy reader bit for bit; the sub-pixel up-conv and space-to-depth
down-conv equal the float64 references at HIGHEST precision. Exit code 1 on any mismatch.

    PYTHONPATH=/tmp/site:. python3 scripts/gpu/check_gpu.py      (after scripts/gpu/common.sh made the data)
    python3 scripts/gpu/check_gpu.py cpu_tiny --set train_path=... --set val_path=...   (CPU smoke test)
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_impl import data as D
from jax_impl import distribute
from jax_impl import model as M
from jax_impl.dali import crop_fns
from shared_data.core import config as C
from shared_data.data import crop_readers, host_batches
from shared_data.data import dali_pipelines as dp
from shared_data.data.sampler import TRAIN, Draws
from shared_data.model import unet_spec

args = sys.argv[1:]
name = args[0] if args and not args[0].startswith("--") else "short_opt"
overrides = dict(C.parse_override(v) for k, v in zip(args, args[1:]) if k == "--set")
base = C.load_config(name, overrides={"global_batch_size": 48, "Nsamples": 96, **overrides})
path = base.data_file("train")
reader = crop_readers.H5LowMemReader(path, 4, 5, base.crop_size)
on_gpu = jax.default_backend() == "gpu"
device_id = 0 if on_gpu else None  # CPU-only pipelines and NumPy crops for the smoke test
ok = True


def bits(a):
    return np.asarray(a).view(np.uint32)


draws = Draws(np.tile(np.array([[3, 70, 111]]) % (reader.size - base.crop_size + 1), (48, 1)), np.arange(48))
plan = host_batches.EpochPlan([draws], [np.ones(48, np.float32)])
rx, ry = crop_readers.make_batch(reader, draws, base)
for kind in ("dali-npy", "dali-h5", "dali-device"):
    cfg = C.replace(base, data_loader_config=kind, dali_h5_mode="simple")
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, reader.size)
    plans._cache = {0: plan}
    sources = None
    if kind == "dali-h5":
        sources = dp.crop_sources(plans, path, cfg)
    elif kind == "dali-device":
        fns = crop_fns(dp.load_volumes(path, cfg), device_id, cfg.crop_size)
        sources = dp.device_crop_sources(plans, fns, cfg)
    pipe = dp.build_pipeline(cfg, "train", 48, device_id, plans, sources)
    pipe.build()
    x, y, _ = pipe.run()
    x, y = (t.as_cpu().as_array() if on_gpu else t.as_array() for t in (x, y))
    same = np.array_equal(bits(x), bits(rx)) and np.array_equal(bits(y), bits(ry))
    print(f"DALI {'GPU' if on_gpu else 'CPU'} {kind}, 48 symmetries == NumPy reader, bit for bit:", same)
    ok &= same

mesh = distribute.make_mesh(1)
dev = D.make_input(C.replace(base, data_loader_config="device"), "train", mesh)
nat = D.make_input(C.replace(base, data_loader_config="inmem"), "train", mesh)
same = all(np.array_equal(bits(a[k]), bits(b[k])) for a, b in zip(dev.epoch(0), nat.epoch(0)) for k in a)
print(f"JAX device loader on {jax.default_backend()} == NumPy reader, bit for bit:", same)
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
        ref_d = unet_spec.conv_reference(xx, w)
        err_d = np.linalg.norm(got_d - ref_d) / np.linalg.norm(ref_d)
        print(f"GPU up-conv n={n}: rel err {err:.2e}; down-conv rel err {err_d:.2e}")
        ok &= err < 1e-5 and err_d < 1e-5
sys.exit(0 if ok else 1)
