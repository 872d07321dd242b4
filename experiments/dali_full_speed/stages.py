"""Per-stage cost of the GPU-resident DALI input (``dali-device``): the same crops through pipelines
that stop after each stage, timed through DALI's JAX iterator (IO: batches ready on the GPU).

    cut       JAX's crop function alone (crops of ``dali_device_cut_steps`` steps per call)
    layout    + DALI: one static transpose of the channel-first crops to DHWC
    axes      + DALI: the per-sample axis order (six conditional transposes) instead
    flips     + DALI: per-sample flips (the production ``dali-device`` pipeline)
    channels  the same with the channel part in DALI too (unmapped crops, ``sequence_rearrange`` and
              the sign product before the axes): what the file-reading modes do on the GPU

    PYTHONPATH=/tmp/site:. python3 experiments/dali_full_speed/stages.py --config short_opt --full --out r.jsonl

With ``--full`` each DALI stage also feeds the kit's compiled train step (FULL through this stage's
pipeline), so the cost of DALI beside the step shows per stage.

Runs on a CPU too (CPU-only pipelines, NumPy crops) for the smoke test.
"""

import argparse
import functools
import itertools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.errors import run_cli
from shared_data.data import dali_pipelines as dp
from shared_data.data import dataset, symmetry
from shared_data.data.sampler import TRAIN

from jax_impl import dali as jdali
from jax_impl import distribute

STAGES = ("cut", "layout", "axes", "flips", "channels")

# Below: a local copy of the dali-device pipeline this study measured (conditional transposes, flips).
AXIS_ORDERS = tuple(itertools.permutations(range(3)))  # spatial axis orders; index = ``axis_order``
AXIS_PARAMS = ("axis_order", "flip_d", "flip_h", "flip_w")


@functools.cache
def _axis_tables():
    perms, signs = symmetry.gather_tables(1, ())[:2]
    order = np.array([AXIS_ORDERS.index(tuple(p)) for p in perms], np.int32)
    return order, (signs < 0).astype(np.int32)  # (48,), (48, 3): flip output axis D, H, W


class StageParams(dp.PlanSource):
    """:class:`shared_data.data.dali_pipelines.PlanSource` that also gives ``axis_order`` (index in
    :data:`AXIS_ORDERS`) and ``flip_d``, ``flip_h``, ``flip_w`` int32 (B,) of each step."""

    def __call__(self, info):
        plan = self.plans(info.epoch_idx)
        if info.iteration >= len(plan):
            raise StopIteration
        draws = plan.draws[info.iteration]
        p = dp.step_params(draws, plan.masks[info.iteration], self.plans.cfg)
        order, flips = _axis_tables()
        g = draws.symmetries
        p.update(axis_order=order[g], flip_d=flips[g, 0], flip_h=flips[g, 1], flip_w=flips[g, 2])
        return tuple(p[k] for k in self.names)


def permute_axes(fn, x, order, channel_first: bool):
    """``x`` (CDHW if ``channel_first``, else DHWC) with its spatial axes in the per-sample order
    ``order`` (an index into :data:`AXIS_ORDERS`), as DHWC: one ``fn.transpose`` per branch of DALI's
    conditional execution, each run on just the samples of its order."""
    c, first = (0, 1) if channel_first else (3, 0)
    perms = [[first + a for a in axes] + [c] for axes in AXIS_ORDERS]
    # DALI's conditionals turn ``if`` statements on per-sample predicates into a split and merge of
    # the batch, so the six orders are written out as six branches
    if order == 0:
        out = fn.transpose(x, perm=perms[0], output_layout="DHWC")
    elif order == 1:
        out = fn.transpose(x, perm=perms[1], output_layout="DHWC")
    elif order == 2:
        out = fn.transpose(x, perm=perms[2], output_layout="DHWC")
    elif order == 3:
        out = fn.transpose(x, perm=perms[3], output_layout="DHWC")
    elif order == 4:
        out = fn.transpose(x, perm=perms[4], output_layout="DHWC")
    else:
        out = fn.transpose(x, perm=perms[5], output_layout="DHWC")
    return out


def crop_fns(volumes: dict, device_id, size: int) -> dict:
    """Crop functions of the :class:`shared_data.data.dali_pipelines.DeviceCropSource` contract
    returning channel-first (B, C, s, s, s) crops with their channels mapped: on a GPU one jitted
    gather per call, without one NumPy."""
    if device_id is None:

        def host(volume):
            return lambda starts, src, sign: [
                np.ascontiguousarray(np.moveaxis(c, -1, 1))
                for c in dp.numpy_step_crops(volume, starts, src, sign, size=size)
            ]

        return {k: host(v) for k, v in volumes.items()}
    dev = jax.local_devices()[device_id]

    @jax.jit
    def crop(volume, starts, src, sign):
        c = volume.shape[0]
        zero = jnp.zeros((), starts.dtype)

        def one(st, sr, sg):
            cut = lax.dynamic_slice(volume, (zero, st[0], st[1], st[2]), (c, size, size, size))
            return cut[sr] * sg[:, None, None, None]

        return tuple(jax.vmap(one)(starts[k], src[k], sign[k]) for k in range(starts.shape[0]))

    def make(volume):
        on_dev = jax.device_put(volume, dev)
        return lambda starts, src, sign: jax.block_until_ready(
            crop(on_dev, *(jax.device_put(a, dev) for a in (starts, src, sign)))
        )

    return {k: make(v) for k, v in volumes.items()}


class Unmapped:
    """A crop function that cuts without the channel part (identity source, sign 1)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, starts, src, sign):
        k, b, c = src.shape
        ident = np.broadcast_to(np.arange(c, dtype=np.int32), (k, b, c)).copy()
        return self.fn(starts, ident, np.ones((k, b, c), np.float32))


def pipeline(cfg, stage: str, plans, fns, device_id):
    from nvidia.dali import fn, pipeline_def

    device = "gpu" if device_id is not None else "cpu"
    fns = {k: Unmapped(f) for k, f in fns.items()} if stage == "channels" else fns
    sources = dp.device_crop_sources(plans, fns, cfg)
    kind = "dali-h5" if stage == "channels" else "dali-device"
    names = AXIS_PARAMS + tuple(n for n in dp.param_names(kind) if n != "warp")

    @pipeline_def(
        enable_conditionals=True,
        batch_size=cfg.global_batch_size,
        num_threads=cfg.dali_threads,
        device_id=device_id,
        prefetch_queue_depth=cfg.dali_prefetch_queue_depth,
        exec_dynamic=True,
    )
    def pipe():
        outs = fn.external_source(source=StageParams(plans, names), num_outputs=len(names), batch=True, batch_info=True)
        params = dict(zip(names, outs))
        result = []
        for key, io in (("Nbody", "in"), ("Hydro", "out")):
            x = fn.external_source(source=sources[key], batch=True, batch_info=True, no_copy=True, device=device)
            if stage == "layout":
                x = fn.transpose(x, perm=[1, 2, 3, 0], output_layout="DHWC")
            else:
                if stage == "channels":
                    x = dp.map_channels(fn, x, params[f"src_{io}"], params[f"sign_{io}"])
                x = permute_axes(fn, x, params["axis_order"], channel_first=True)
                if stage in ("flips", "channels"):
                    x = fn.flip(x, depthwise=params["flip_d"], vertical=params["flip_h"], horizontal=params["flip_w"])
            result.append(x)
        mask = params["mask"].gpu() if device == "gpu" else params["mask"]
        return (*result, mask)

    return pipe()


def time_stage(cfg, stage: str, steps: int, device_id, bench=None) -> dict:
    path = cfg.data_file("train")
    size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, size)
    fns = crop_fns(dp.load_volumes(path, cfg), device_id, cfg.crop_size)
    if stage == "cut":
        src = {k: dp.channel_tables(cfg, k) for k in dataset.KEYS}

        def batches():
            epoch = 0
            while True:
                plan = plans(epoch)
                for i in range(0, len(plan), cfg.dali_device_cut_steps):
                    part = plan.draws[i : i + cfg.dali_device_cut_steps]
                    st = np.stack([d.starts for d in part]).astype(np.int32)
                    g = np.stack([d.symmetries for d in part])
                    outs = {k: fns[k](st, src[k][0][g], src[k][1][g]) for k in dataset.KEYS}
                    yield from zip(outs["Nbody"], outs["Hydro"])
                epoch += 1

        it = batches()
    else:
        sharding = distribute.batch_sharding(bench.mesh) if (bench is not None and device_id is not None) else None
        samples = len(plans(0)) * cfg.global_batch_size
        dali_it = jdali.make_iterator([pipeline(cfg, stage, plans, fns, device_id)], samples, sharding)

        def epochs():
            while True:  # the iterator ends each epoch and resets itself
                for batch in dali_it:
                    if bench is None:
                        yield batch["inputs"], batch["targets"]
                    elif sharding is None:  # CPU-only pipelines: place the batch like the native loaders
                        yield distribute.put_batch({k: np.asarray(v) for k, v in batch.items()}, bench.mesh)
                    else:
                        yield batch

        it = epochs()
        if bench is not None:
            return full_rate(cfg, stage, it, steps, bench)
    for _ in range(3):  # warm-up: compile the crop function, start DALI
        out = next(it)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = next(it)
    jax.block_until_ready(out)
    sec = (time.perf_counter() - t0) / steps
    return {
        "stage": stage,
        "ms_per_batch": 1e3 * sec,
        "samples_per_sec": cfg.global_batch_size / sec,
        "batch": cfg.global_batch_size,
        "device": str(jax.devices()[0].device_kind),
        "steps": steps,
    }


def full_rate(cfg, stage: str, batches, steps: int, bench) -> dict:
    """FULL: the compiled train step of ``bench`` on the stage's batches (warm-up drains DALI's queue)."""
    out = None
    for _ in range(6):
        bench.state, out = bench.train_fn(bench.state, next(batches))
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        bench.state, out = bench.train_fn(bench.state, next(batches))
    jax.block_until_ready(out)
    sec = (time.perf_counter() - t0) / steps
    return {
        "stage": stage,
        "mode": "full",
        "ms_per_batch": 1e3 * sec,
        "samples_per_sec": cfg.global_batch_size / sec,
        "batch": cfg.global_batch_size,
        "device": str(jax.devices()[0].device_kind),
        "steps": steps,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments/dali_full_speed/stages.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    p.add_argument("--full", action="store_true", help="also FULL: each DALI stage feeding the train step")
    p.add_argument("--out")
    args = p.parse_args(argv)
    cfg = config_mod.replace(config_cli.config_from_args(args), data_loader_config="dali-device")
    device_id = 0 if jax.default_backend() == "gpu" else None
    rows = []
    bench = None
    if args.full:
        from jax_impl.bench import Bench

        bench = Bench(cfg, "synthetic")
        rows.append(full_rate(cfg, "synthetic", iter(lambda: bench.batch, None), args.steps, bench))
    for stage in args.stages:
        rows.append(time_stage(cfg, stage, args.steps, device_id))
        if bench is not None and stage != "cut":
            rows.append(time_stage(cfg, stage, args.steps, device_id, bench))
    for row in rows:
        print(
            f"{row['stage']:<10} {row.get('mode', 'io'):<5} {row['ms_per_batch']:8.3f} ms per batch "
            f"{row['samples_per_sec']:10.1f} samples/s"
        )
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
