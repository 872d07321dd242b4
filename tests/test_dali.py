"""DALI pipelines: the same samples as the NumPy reader (crop, symmetry, vector channels) for
dali-npy and every dali-h5 mode; both frameworks' DALI iterators feed a training step."""
from __future__ import annotations

import numpy as np
import pytest

from shared_data import config as C
from shared_data import dali_pipelines as dp
from shared_data import loader, readers
from shared_data.sampler import TRAIN, Draws

pytest.importorskip("nvidia.dali")


def _run(pipe, steps):
    pipe.build()
    out = []
    for _ in range(steps):
        x, y, m = pipe.run()
        out.append((np.stack([np.array(t) for t in x]), np.stack([np.array(t) for t in y]), np.array(m.as_array())))
    return out


def _reference(cfg, plan):
    r = readers.H5LowMemReader(cfg.resolve_path(cfg.train_path), 4, 5, cfg.crop_size)
    return [readers.make_batch(r, d, cfg) for d in plan.draws]


def test_every_symmetry_through_dali_ops_matches_numpy(tiny_cfg):
    """All 48 elements on one crop: DALI's flip + rotate + coord_transform == symmetry.apply."""
    cfg = C.replace(tiny_cfg, global_batch_size=48, Nsamples=48)
    draws = Draws(np.tile(np.array([[3, 7, 11]]), (48, 1)), np.arange(48))
    plan = loader.EpochPlan([draws], [np.ones(48, np.float32)])
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 32)
    plans._cache = {0: plan}
    pipe = dp.build_pipeline(cfg, "dali-npy", cfg.resolve_path(cfg.train_path), 48, None, plans)
    (x, y, m), = _run(pipe, 1)
    ref_x, ref_y = _reference(cfg, plan)[0]
    for g in range(48):
        np.testing.assert_array_equal(x[g], ref_x[g], err_msg=f"symmetry {g} inputs")
        np.testing.assert_array_equal(y[g], ref_y[g], err_msg=f"symmetry {g} targets")
    assert np.array_equal(m, np.ones(48))


@pytest.mark.parametrize("kind, mode", [("dali-npy", None), ("dali-lowmem", None), ("dali-h5", "simple"),
                                        ("dali-h5", "prefetch"), ("dali-h5", "parallel")])
def test_dali_yields_the_numpy_readers_samples(tiny_cfg, kind, mode):
    cfg = C.replace(tiny_cfg, data_loader_config=kind, dali_h5_mode=mode or "parallel", Nsamples=16, num_data_workers=2)
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 32)
    sources = dp.crop_sources(plans, cfg.resolve_path(cfg.train_path), cfg) if kind == "dali-h5" else None
    pipe = dp.build_pipeline(cfg, kind, cfg.resolve_path(cfg.train_path), 4, None, plans, sources)
    got = _run(pipe, len(plans(0)))
    for (x, y, m), (rx, ry) in zip(got, _reference(cfg, plans(0))):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
        assert (m == 1).all()


def test_missing_npy_names_the_converter(tiny_cfg, tmp_path):
    import shutil
    h5 = tmp_path / "only.h5"
    shutil.copy(tiny_cfg.resolve_path(tiny_cfg.train_path), h5)
    cfg = C.replace(tiny_cfg, train_path=str(h5))
    with pytest.raises(Exception, match=r"only_Nbody\.npy not found: .*python -m shared_data\.convert .*only\.h5"):
        dp.build_pipeline(cfg, "dali-npy", h5, 4, None, dp.EpochPlans(cfg, TRAIN, [0], 1, 32))


def test_missing_dali_names_the_extra(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(Exception, match=r"pip install -e '\.\[dali\]'"):
        dp.require_dali()


def _cfg(tiny_cfg, kind):
    # Nsamples_val=6 with a global batch of 4: 2 validation steps, the last one half padding
    return C.replace(tiny_cfg, data_loader_config=kind, Nsamples=12, Nsamples_val=6, dali_h5_mode="prefetch")


def _dali_matches_native(make_input, cfg, context, to_numpy):
    """Both splits, two epochs: the DALI input yields the lowmem loader's batches; returns the
    first training batch of the last epoch compared."""
    first = None
    for split in ("train", "val"):
        dali, native = make_input(cfg, split, context), make_input(C.replace(cfg, data_loader_config="lowmem"), split, context)
        assert dali.steps == native.steps == (3 if split == "train" else 2)
        for epoch in (0, 1):
            got, want = list(dali.epoch(epoch)), list(native.epoch(epoch))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(to_numpy(g[k]), to_numpy(w[k]), err_msg=f"{split} {epoch} {k}")
            first = got[0] if split == "train" else first
    assert to_numpy(w["mask"]).tolist() == [1, 1, 0, 0]  # the padded last validation batch
    return first


@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5"])
def test_jax_dali_iterator_matches_native_loader_and_feeds_a_step(tiny_cfg, kind):
    import functools

    import jax
    from jax_impl import data as D
    from jax_impl import distribute
    from jax_impl import model as M
    from jax_impl import train as T
    cfg = _cfg(tiny_cfg, kind)
    batch = _dali_matches_native(D.make_input, cfg, distribute.make_mesh(1), np.asarray)
    tx = T.make_optimizer(np.full(4, 1e-3, np.float32))
    state = T.create_train_state(cfg, M.init_params(cfg, 0), tx)
    step = jax.jit(functools.partial(T.train_step, model=M.build_model(cfg), tx=tx, cfg=cfg))
    _, m = step(state, batch)
    assert np.isfinite(float(m["loss"]))


@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5"])
def test_tf_dali_dataset_matches_native_loader_and_feeds_a_step(tiny_cfg, kind):
    import tensorflow as tf
    from tf_impl import data as D
    from tf_impl import distribute
    from tf_impl import model as M
    from tf_impl import train as T
    cfg = _cfg(tiny_cfg, kind)
    batch = _dali_matches_native(D.make_input, cfg, distribute.make_strategy(), lambda t: t.numpy())
    model, opt = M.build_model(cfg), T.make_optimizer(cfg, np.full(4, 1e-3, np.float32))
    m = tf.function(lambda b: T.train_step(model, opt, b, cfg, 1))(batch)
    assert np.isfinite(float(m["loss"]))
