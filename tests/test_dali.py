"""DALI pipelines: the same samples as the NumPy reader (crop, symmetry, vector channels) for
dali-npy and every dali-h5 mode; both frameworks' DALI iterators feed a training step."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from shared_data.core import config as config_mod
from shared_data.data import crop_readers, host_batches
from shared_data.data import dali_pipelines as dp
from shared_data.data.sampler import TRAIN, Draws

pytest.importorskip("nvidia.dali")


def _run(pipe, steps):
    pipe.build()
    out = []
    for _ in range(steps):
        x, y, m = pipe.run()
        out.append((np.stack([np.array(t) for t in x]), np.stack([np.array(t) for t in y]), np.array(m.as_array())))
    return out


def _reference(cfg, plan):
    r = crop_readers.H5LowMemReader(cfg.data_file("train"), 4, 5, cfg.crop_size)
    return [crop_readers.make_batch(r, d, cfg) for d in plan.draws]


def _signed_zero_volume(tmp_path):
    """A 16^3 file of the dataset contract holding random values, +0.0 and -0.0 (and its .npy twins)."""
    import h5py

    from shared_data.data.convert import convert_to_npy

    rng = np.random.default_rng(3)
    path = tmp_path / "zeros.h5"
    with h5py.File(path, "w") as f:
        for key, c in (("Nbody", 4), ("Hydro", 5)):
            v = (0.3 * rng.standard_normal((c, 16, 16, 16))).astype(np.float32)
            v[:, :3], v[:, 3:6] = 0.0, -0.0
            f[key] = v
    convert_to_npy(path)
    return path


@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5", "dali-device"])
def test_every_symmetry_through_dali_ops_is_bit_for_bit_numpy(tiny_cfg, tmp_path, kind):
    """All 48 elements on one crop through DALI's ops (channel rearrange and sign, per-sample axis
    order, flips; dali-device with the channel part in the crop function) == ``symmetry.apply``,
    compared bit for bit, signed zeros included."""
    path = _signed_zero_volume(tmp_path)
    cfg = config_mod.replace(
        tiny_cfg,
        global_batch_size=48,
        Nsamples=48,
        data_loader_config=kind,
        dali_h5_mode="simple",
        train_path=str(path),
        crop_size=8,
    )
    draws = Draws(np.tile(np.array([[1, 0, 7]]), (48, 1)), np.arange(48))
    plan = host_batches.EpochPlan([draws], [np.ones(48, np.float32)])
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 16)
    plans._cache = {0: plan}
    sources = None
    if kind == "dali-h5":
        sources = dp.crop_sources(plans, path, cfg)
    elif kind == "dali-device":
        fns = {k: functools.partial(dp.numpy_step_crops, v, size=8) for k, v in dp.load_volumes(path, cfg).items()}
        sources = dp.device_crop_sources(plans, fns, cfg)
    ((x, y, m),) = _run(dp.build_pipeline(cfg, "train", 48, None, plans, sources), 1)
    ref_x, ref_y = _reference(cfg, plan)[0]
    assert (ref_x == 0).any() and np.signbit(ref_x[ref_x == 0]).any() and not np.signbit(ref_x[ref_x == 0]).all()
    for g in range(48):
        np.testing.assert_array_equal(x[g].view(np.uint32), ref_x[g].view(np.uint32), err_msg=f"symmetry {g} inputs")
        np.testing.assert_array_equal(y[g].view(np.uint32), ref_y[g].view(np.uint32), err_msg=f"symmetry {g} targets")
    assert np.array_equal(m, np.ones(48))


@pytest.mark.parametrize("crop", [5, 8])
def test_warp_tables_move_voxels_as_the_symmetry_table(crop):
    """Each of the 48 warp matrices through ``fn.warp_affine`` (a CPU pipeline, the production call)
    moves the voxels of a random DHWC cube exactly as ``symmetry.apply_spatial`` does (a float64
    NumPy reference), every channel alike; odd and even sides."""
    from nvidia.dali import fn, pipeline_def

    from shared_data.data import symmetry

    cube = np.random.default_rng(7).standard_normal((crop, crop, crop, 2)).astype(np.float32)

    @pipeline_def(batch_size=48, num_threads=1, device_id=None)
    def pipe():
        x = fn.external_source(source=lambda: [cube] * 48, layout="DHWC")
        return dp.move_voxels(fn, x, fn.external_source(source=lambda: list(dp.warp_tables(crop))))

    p = pipe()
    p.build()
    (out,) = p.run()
    for g in range(48):
        want = symmetry.apply_spatial(cube.astype(np.float64), g)
        got = np.array(out[g]).astype(np.float64)
        np.testing.assert_array_equal(got, want, err_msg=f"symmetry {g}")


@pytest.mark.parametrize("crop", [5, 64])
def test_warp_tables_are_exact(crop):
    """The matrices are the symmetry's signed permutation in DALI's (x, y, z) = (W, H, D) order,
    entries exactly 0 and +-1, shifts whole numbers (0 or the crop side), and each fixes the
    cube's centre exactly."""
    from shared_data.data import symmetry

    table = dp.warp_tables(crop)
    assert table.shape == (48, 3, 4) and table.dtype == np.float32
    for g in range(48):
        rot, shift = table[g, :, :3], table[g, :, 3]
        assert np.array_equal(rot, symmetry.matrix(g)[::-1, ::-1]), g
        assert set(np.abs(rot).ravel().tolist()) == {0.0, 1.0}
        assert set(shift.tolist()) <= {0.0, float(crop)}, shift
        centre = np.full(3, crop / 2, np.float32)
        assert np.array_equal(rot @ centre + shift, centre), g


@pytest.mark.parametrize(
    "kind, mode",
    [
        ("dali-npy", None),
        ("dali-lowmem", None),
        ("dali-h5", "simple"),
        ("dali-h5", "prefetch"),
        ("dali-h5", "parallel"),
        ("dali-device", None),
    ],
)
def test_dali_yields_the_numpy_readers_samples(tiny_cfg, kind, mode):
    cfg = config_mod.replace(
        tiny_cfg, data_loader_config=kind, dali_h5_mode=mode or "parallel", Nsamples=16, num_data_workers=2
    )
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 32)
    path = cfg.data_file("train")
    sources = dp.crop_sources(plans, path, cfg) if kind == "dali-h5" else None
    if kind == "dali-device":
        fns = {
            k: functools.partial(dp.numpy_step_crops, v, size=cfg.crop_size)
            for k, v in dp.load_volumes(path, cfg).items()
        }
        sources = dp.device_crop_sources(plans, fns, cfg)
    pipe = dp.build_pipeline(cfg, "train", 4, None, plans, sources)
    got = _run(pipe, len(plans(0)))
    for (x, y, m), (rx, ry) in zip(got, _reference(cfg, plans(0))):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
        assert (m == 1).all()


def test_missing_npy_names_the_converter(tiny_cfg, tmp_path):
    import shutil

    from shared_data.runtime import checks

    h5 = tmp_path / "only.h5"
    shutil.copy(tiny_cfg.data_file("train"), h5)
    cfg = config_mod.replace(tiny_cfg, train_path=str(h5), data_loader_config="dali-npy")
    converter = r"python -m shared_data\.data\.convert .*only\.h5"
    with pytest.raises(Exception, match=r"only_Nbody\.npy not found: .*" + converter):
        checks.check_data(cfg)


def test_missing_dali_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(Exception, match=r"pip install -e '\.\[dali\]'"):
        dp.require_dali()


def _cfg(tiny_cfg, kind):
    # Nsamples_val=6 with a global batch of 4: 2 validation steps, the last one half padding
    return config_mod.replace(tiny_cfg, data_loader_config=kind, Nsamples=12, Nsamples_val=6, dali_h5_mode="prefetch")


def _dali_matches_native(make_input, cfg, context, to_numpy):
    """Both splits, two epochs: the DALI input yields the lowmem loader's batches; returns the
    first training batch of the last epoch compared."""
    first = None
    for split in ("train", "val"):
        dali, native = (
            make_input(cfg, split, context),
            make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, context),
        )
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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5", "dali-device"])
def test_jax_dali_iterator_matches_native_loader_and_feeds_a_step(tiny_cfg, kind):
    import functools

    import jax

    from jax_impl import data as data_mod
    from jax_impl import distribute
    from jax_impl import model as model_mod
    from jax_impl import step as step_mod

    cfg = _cfg(tiny_cfg, kind)
    batch = _dali_matches_native(data_mod.make_input, cfg, distribute.make_mesh(1), np.asarray)
    tx = step_mod.make_optimizer(cfg, np.full(4, 1e-3, np.float32))
    state = step_mod.create_train_state(cfg, model_mod.init_params(cfg, 0), tx)
    step = jax.jit(functools.partial(step_mod.train_step, model=model_mod.build_model(cfg), tx=tx, cfg=cfg))
    _, m = step(state, batch)
    assert np.isfinite(float(m["loss"]))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dali-npy", "dali-h5", "dali-device"])
def test_tf_dali_dataset_matches_native_loader_and_feeds_a_step(tiny_cfg, kind):
    import tensorflow as tf

    from tf_impl import data as data_mod
    from tf_impl import distribute
    from tf_impl import model as model_mod
    from tf_impl import step as step_mod

    cfg = _cfg(tiny_cfg, kind)
    batch = _dali_matches_native(data_mod.make_input, cfg, distribute.make_strategy(), lambda t: t.numpy())
    model, opt = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, np.full(4, 1e-3, np.float32))
    m = tf.function(lambda b: step_mod.train_step(model, opt, b, cfg, 1))(batch)
    assert np.isfinite(float(m["loss"]))


def test_jax_device_crop_fn_equals_numpy_crops():
    """The jitted gather behind JAX's dali-device on a GPU (run here on a CPU device) cuts exactly
    the NumPy crops, DHWC with their channels mapped, the edges of the volume included."""
    import jax

    from jax_impl.dali import crop_fns

    rng = np.random.default_rng(5)
    vol = {"Nbody": rng.standard_normal((4, 12, 12, 12)).astype(np.float32)}
    starts = np.array([[0, 0, 0], [7, 3, 5], [7, 7, 7]], np.int32)
    src = np.array([[0, 1, 2, 3], [0, 3, 1, 2], [0, 2, 3, 1]], np.int32)
    sign = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, -1, -1, -1]], np.float32)
    got, second = crop_fns(vol, 0, 5)["Nbody"](
        np.stack([starts, starts[::-1]]), np.stack([src, src]), np.stack([sign, sign])
    )  # two steps in one call
    assert isinstance(got, jax.Array) and got.shape == (3, 5, 5, 5, 4)
    np.testing.assert_array_equal(np.asarray(second), dp.numpy_crops(vol["Nbody"], starts[::-1], src, sign, size=5))
    want = dp.numpy_crops(vol["Nbody"], starts, src, sign, size=5)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(np.asarray(got)[0], np.moveaxis(vol["Nbody"][:, 0:5, 0:5, 0:5], 0, -1))
    np.testing.assert_array_equal(np.asarray(got)[1][..., 1], -vol["Nbody"][3, 7:12, 3:8, 5:10])


def test_tf_device_crop_fn_equals_numpy_crops():
    """The XLA gather behind TF's dali-device on a GPU (run here on the CPU device) cuts exactly the
    NumPy crops, DHWC with their channels mapped, the volume's edges included, and hands them over
    as DLPack capsules."""
    import tensorflow as tf

    from tf_impl.dali import crop_fns

    rng = np.random.default_rng(5)
    vol = {"Nbody": rng.standard_normal((4, 12, 12, 12)).astype(np.float32)}
    starts = np.array([[0, 0, 0], [7, 3, 5], [7, 7, 7]], np.int32)
    src = np.array([[0, 1, 2, 3], [0, 3, 1, 2], [0, 2, 3, 1]], np.int32)
    sign = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, -1, -1, -1]], np.float32)
    capsules = crop_fns(vol, "/CPU:0", 5)["Nbody"](
        np.stack([starts, starts[::-1]]), np.stack([src, src]), np.stack([sign, sign])
    )  # two steps in one call
    got, second = (tf.experimental.dlpack.from_dlpack(c).numpy() for c in capsules)
    assert got.shape == (3, 5, 5, 5, 4)
    np.testing.assert_array_equal(second, dp.numpy_crops(vol["Nbody"], starts[::-1], src, sign, size=5))
    want = dp.numpy_crops(vol["Nbody"], starts, src, sign, size=5)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got[0], np.moveaxis(vol["Nbody"][:, 0:5, 0:5, 0:5], 0, -1))
    np.testing.assert_array_equal(got[1][..., 1], -vol["Nbody"][3, 7:12, 3:8, 5:10])


def test_tf_pipelines_run_from_python_match_native_loader(tiny_cfg):
    """TF's dali-device on GPUs runs its pipelines from Python (no tf.data): here CPU-only, two
    epochs of each split equal the NumPy loader's batches bit for bit."""
    from tf_impl import dali, distribute
    from tf_impl import data as data_mod

    cfg = _cfg(tiny_cfg, "dali-device")
    strategy = distribute.make_strategy()
    for split in ("train", "val"):
        got_in = dali.DaliDeviceInput(cfg, split, strategy)
        want_in = data_mod.make_input(config_mod.replace(cfg, data_loader_config="lowmem"), split, strategy)
        for epoch in (0, 1):
            # the trainer takes ``steps`` batches and never asks for more, as islice does
            got = list(itertools.islice(got_in.epoch(epoch), got_in.steps))
            want = list(want_in.epoch(epoch))
            assert len(got) == len(want) == got_in.steps > 0
            for g, w in zip(got, want):
                for k in ("inputs", "targets", "mask"):
                    np.testing.assert_array_equal(g[k].numpy(), w[k].numpy(), err_msg=f"{split} {epoch} {k}")


def test_jax_iterator_over_two_pipelines_keeps_each_shards_epochs(tiny_cfg):
    """Two pipelines (what two GPUs get), three epochs: each batch is shard 0's and shard 1's batch of
    the same step, as the single-pipeline iterators give them (DALI needs the epoch size here)."""
    import warnings

    from jax_impl.dali import make_iterator

    cfg = config_mod.replace(tiny_cfg, data_loader_config="dali-npy", Nsamples=12)

    def pipes(shards):
        return [dp.build_pipeline(cfg, "train", 2, None, dp.EpochPlans(cfg, TRAIN, [r], 2, 32)) for r in shards]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DALI recommends reader_name over size; external sources have none
        both = make_iterator(pipes([0, 1]), 3 * 2)
        singles = [make_iterator(pipes([r]), 3 * 2) for r in (0, 1)]
        for epoch in range(3):
            got, refs = list(both), [list(s) for s in singles]
            assert len(got) == len(refs[0]) == len(refs[1]) == 3, f"epoch {epoch}"
            for i, g in enumerate(got):
                x = np.asarray(g["inputs"])  # (pipelines, batch, ...) without a sharding
                np.testing.assert_array_equal(x[0], np.asarray(refs[0][i]["inputs"]))
                np.testing.assert_array_equal(x[1], np.asarray(refs[1][i]["inputs"]))
                assert not np.array_equal(x[0], x[1])


def test_device_crop_source_cuts_several_steps_per_call(tiny_cfg):
    """dali_device_cut_steps=3 over a 5-step epoch: the crop function runs twice (steps 0-2, 3-4),
    and each step gets exactly its own crops, channels mapped, as cut one step at a time."""
    cfg = config_mod.replace(tiny_cfg, data_loader_config="dali-device", Nsamples=20, dali_device_cut_steps=3)
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, 32)
    vol = dp.load_volumes(cfg.data_file("train"), cfg)["Hydro"]
    calls = []

    def crop_fn(starts, src, sign):
        calls.append(len(starts))
        return dp.numpy_step_crops(vol, starts, src, sign, size=cfg.crop_size)

    source = dp.DeviceCropSource(plans, crop_fn, 4, "Hydro", cfg.dali_device_cut_steps)
    info = type("Info", (), {})
    src, sign = dp.channel_tables(cfg, "Hydro")
    for step in range(5):
        info.epoch_idx, info.iteration = 0, step
        d = plans(0).draws[step]
        want = dp.numpy_crops(vol, d.starts, src[d.symmetries], sign[d.symmetries], size=cfg.crop_size)
        np.testing.assert_array_equal(source(info), want)
    assert calls == [3, 2]
    info.iteration = 5
    with pytest.raises(StopIteration):
        source(info)


def _resumed_input_is_the_rest_of_the_run(make_input, cfg, context, to_numpy, steps_of=None, resume=None, crops=None):
    """An input made at the data cursor (epoch 1, step 2 of 3; by ``resume`` where given) yields
    step 2 of epoch 1, then all of epoch 2: the lowmem loader's batches of a fresh input, bit for bit
    (a ``device`` loader's batches as its steps cut them, by ``crops``)."""
    resumed = (resume or make_input)(cfg, "train", context, 1, 2)
    native = make_input(config_mod.replace(cfg, data_loader_config="lowmem"), "train", context)
    for epoch, first in ((1, 2), (2, 0)):
        it = resumed.epoch(epoch)
        got = list(itertools.islice(it, steps_of(resumed, first)) if steps_of else it)
        got = [crops(b, cfg) for b in got] if crops else got
        want = list(native.epoch(epoch))[first:]
        assert len(got) == len(want) == 3 - first
        for g, w in zip(got, want):
            for k in ("inputs", "targets", "mask"):
                np.testing.assert_array_equal(to_numpy(g[k]), to_numpy(w[k]), err_msg=f"{epoch} {k}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["device", "dali-npy", "dali-h5", "dali-device"])
def test_jax_inputs_resume_at_a_data_cursor(tiny_cfg, kind):
    from jax_impl import data as data_mod
    from jax_impl import distribute

    cfg = _cfg(tiny_cfg, kind)
    mesh = distribute.make_mesh(1)
    _resumed_input_is_the_rest_of_the_run(data_mod.make_input, cfg, mesh, np.asarray, crops=data_mod.crops)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["device", "dali-npy", "dali-h5", "dali-device", "dali-device from Python"])
def test_tf_inputs_resume_at_a_data_cursor(tiny_cfg, kind):
    from tf_impl import dali, distribute
    from tf_impl import data as data_mod

    cfg = _cfg(tiny_cfg, kind.split()[0])
    resume, steps_of = None, None
    if kind.endswith("Python"):  # what runs on GPUs; the trainer takes steps - first_step batches
        resume, steps_of = dali.DaliDeviceInput, lambda inp, first: inp.steps - first
    strategy = distribute.make_strategy()
    to_numpy = lambda t: t.numpy()
    _resumed_input_is_the_rest_of_the_run(
        data_mod.make_input, cfg, strategy, to_numpy, steps_of, resume, data_mod.crops
    )
