"""Where ``dali-device`` loses time beside the train step, and what a DALI pipeline can reach: the same
crops through DALI's JAX iterator (``DALIGenericIterator``, zero-copy under ``exec_dynamic``) with
the symmetry done in different places, each timed alone (IO) and feeding the kit's compiled train
step (FULL).

    production   the production ``dali-device`` pipeline (``dali_pipelines.build_pipeline``): JAX
                 cuts DHWC crops with the channel part applied (``jax_impl.dali.crop_fns``); DALI:
                 one ``fn.warp_affine`` per volume (``dali_pipelines.warp_tables``)
    warp         the same crops and warp in a pipeline of this script's own (the matrices from a
                 callback of their own): nearest neighbour, a per-sample signed-permutation matrix
                 (axis order and flips in one pass; exact, the coordinates are integers + 0.5)
    warp_cl      as warp, but the volumes are held channels-last (L, L, L, C), so the cut is a copy of
                 contiguous rows with the channel part, no transpose
    passthrough  JAX cuts DHWC crops with the whole symmetry (the ``device`` loader's gather,
                 outside the step); DALI hands them on untouched: what DALI as a transport costs,
                 the bound of any DALI pipeline fed by a cut outside the step
    gather       the passthrough's cut fed straight to the step, no DALI (the cost of a cut outside
                 the step, beside the device loader's, which cuts inside it)

    PYTHONPATH=/tmp/site:. python3 experiments/dali_iterators/variants.py --config short_opt --full --out r.jsonl
    PYTHONPATH=. python3 experiments/dali_iterators/variants.py --config cpu_tiny --check 12   # CPU: exactness

``--check N`` compares N batches of every variant with the NumPy reader's (bit for bit, all symmetries of
the plan) before timing. Runs on a CPU too (CPU-only pipelines, NumPy crops) for the smoke test.

The records in ``results/call1_h100`` and ``results/call2_h100`` name ``conditional`` the production
pipeline they measured: channel-first crops, six transposes under DALI's conditional execution (the
axis order) and per-sample flips.
"""

import argparse
import json
import sys
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.errors import run_cli
from shared_data.data import crop_readers, dataset, host_batches
from shared_data.data import dali_pipelines as dp
from shared_data.data.sampler import TRAIN

from jax_impl import dali as jdali
from jax_impl import data as jdata
from jax_impl import distribute

VARIANTS = ("production", "warp", "warp_cl", "passthrough", "gather")


def cut_fn(volume: np.ndarray, device_id, crop: int, whole: bool, cfg, key: str | None, channels_last=False):
    """A :class:`shared_data.data.dali_pipelines.DeviceCropSource` crop function returning DHWC crops.

    ``whole=False``: ``volume`` channel-first (C, L, L, L) of ``key``; crops with the channel part
    applied: the production crop function (:func:`jax_impl.dali.crop_fns`, the warp variant) or,
    ``channels_last``, a cut of the volume held (L, L, L, C) (the warp_cl variant). ``whole=True``:
    ``volume`` the ``device`` loader's (L^3, C) array; crops with the whole symmetry, inputs and
    targets (the passthrough variant; ``src``/``sign`` are then the symmetry index per sample in
    ``src[..., 0]``)."""
    if whole:
        static = host_batches.gather_statics(cfg, host_batches.volume_side(volume.shape[0]))

        def host(starts, syms):
            out = jdata.gather_batch(
                jnp.asarray(volume), jnp.asarray(starts), jnp.asarray(syms), jnp.ones(len(starts)), **static
            )
            return np.asarray(out["inputs"]), np.asarray(out["targets"])

        if device_id is None:
            return lambda starts, syms: [host(st, sy) for st, sy in zip(starts, syms)]
        dev = jax.local_devices()[device_id]
        on_dev = jax.device_put(volume, dev)

        @jax.jit
        def cut(vol, starts, syms):
            ones = jnp.ones(starts.shape[1], jnp.float32)
            outs = [jdata.gather_batch(vol, starts[k], syms[k], ones, **static) for k in range(starts.shape[0])]
            return tuple((o["inputs"], o["targets"]) for o in outs)

        return lambda starts, syms: jax.block_until_ready(
            cut(on_dev, *(jax.device_put(a, dev) for a in (starts, syms)))
        )

    if not channels_last:
        return jdali.crop_fns({key: volume}, device_id, crop)[key]
    volume = np.ascontiguousarray(np.moveaxis(volume, 0, -1))
    if device_id is None:

        def numpy_cut(starts, src, sign):  # a fancy index on the last axis leaves a strided array: pack it
            return [
                np.ascontiguousarray(
                    np.stack(
                        [
                            volume[x : x + crop, y : y + crop, z : z + crop][..., r] * g
                            for (x, y, z), r, g in zip(st, sr, sg)
                        ]
                    )
                )
                for st, sr, sg in zip(starts, src, sign)
            ]

        return numpy_cut
    dev = jax.local_devices()[device_id]
    on_dev = jax.device_put(volume, dev)

    @jax.jit
    def cut(vol, starts, src, sign):
        zero = jnp.zeros((), starts.dtype)

        def one(st, sr, sg):
            piece = lax.dynamic_slice(vol, (st[0], st[1], st[2], zero), (crop, crop, crop, vol.shape[-1]))
            return piece[..., sr] * sg

        return tuple(jax.vmap(one)(starts[k], src[k], sign[k]) for k in range(starts.shape[0]))

    return lambda starts, src, sign: jax.block_until_ready(
        cut(on_dev, *(jax.device_put(a, dev) for a in (starts, src, sign)))
    )


class WholeSource:
    """Batch callback of the passthrough variant: both volumes' crops of a step from one gather, as
    two outputs; the crops of ``cut_steps`` steps cut per call, kept alive ``ring`` steps."""

    def __init__(self, plans, cut, ring: int, cut_steps: int):
        self.plans, self.cut, self.cut_steps = plans, cut, cut_steps
        self._ring, self._slot, self._cut = [None] * ring, 0, {}

    def __call__(self, info):
        plan = self.plans(info.epoch_idx)
        i = info.iteration
        if i >= len(plan):
            raise StopIteration
        if (info.epoch_idx, i) not in self._cut:
            steps = range(i, min(i + self.cut_steps, len(plan)))
            starts = np.stack([plan.draws[j].starts for j in steps]).astype(np.int32)
            syms = np.stack([plan.draws[j].symmetries for j in steps]).astype(np.int32)
            self._cut = {(info.epoch_idx, j): c for j, c in zip(steps, self.cut(starts, syms))}
        out = self._cut.pop((info.epoch_idx, i))
        self._ring[self._slot] = out
        self._slot = (self._slot + 1) % len(self._ring)
        return out


class WarpSource:
    """The per-sample warp matrices of a step ((B, 3, 4) float32, from
    :func:`shared_data.data.dali_pipelines.warp_tables`)."""

    def __init__(self, plans, crop: int):
        self.plans, self.table = plans, dp.warp_tables(crop)

    def __call__(self, info):
        plan = self.plans(info.epoch_idx)
        if info.iteration >= len(plan):
            raise StopIteration
        return self.table[plan.draws[info.iteration].symmetries]


def pipeline(cfg, variant: str, plans, device_id, depth: int):
    """The DALI pipeline of ``variant`` over ``plans`` (one shard), ``depth`` batches of prefetch."""
    from nvidia.dali import fn, pipeline_def, types

    device = "gpu" if device_id is not None else "cpu"
    path = cfg.data_file("train")
    ring = depth + 2
    if variant == "production":
        fns = jdali.crop_fns(dp.load_volumes(path, cfg), device_id, cfg.crop_size)
        deep = config_mod.replace(cfg, dali_prefetch_queue_depth=depth)  # the crops' ring follows the depth
        return dp.build_pipeline(
            deep, "train", cfg.global_batch_size, device_id, plans, dp.device_crop_sources(plans, fns, deep)
        )
    kw = dict(batch_size=cfg.global_batch_size, num_threads=cfg.dali_threads, device_id=device_id)

    @pipeline_def(prefetch_queue_depth=depth, exec_dynamic=True, **kw)
    def pipe():
        mask = fn.external_source(source=dp.PlanSource(plans, ["mask"]), num_outputs=1, batch=True, batch_info=True)[0]
        mask = mask.gpu() if device == "gpu" else mask
        if variant == "passthrough":
            reader = crop_readers.InMemReader(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
            cut = cut_fn(host_batches.device_volume(reader), device_id, cfg.crop_size, True, cfg, None)
            nb, hy = fn.external_source(
                source=WholeSource(plans, cut, ring, cfg.dali_device_cut_steps),
                num_outputs=2,
                batch=True,
                batch_info=True,
                no_copy=True,
                device=device,
                layout=["DHWC", "DHWC"],
            )
            return nb, hy, mask
        volumes = dp.load_volumes(path, cfg)
        matrices = fn.external_source(source=WarpSource(plans, cfg.crop_size), batch=True, batch_info=True)
        outs = []
        for key in dataset.KEYS:
            cut = cut_fn(volumes[key], device_id, cfg.crop_size, False, cfg, key, variant == "warp_cl")
            src = dp.DeviceCropSource(plans, cut, ring, key, cfg.dali_device_cut_steps)
            x = fn.external_source(source=src, batch=True, batch_info=True, no_copy=True, device=device, layout="DHWC")
            outs.append(
                fn.warp_affine(x, matrix=matrices, inverse_map=False, interp_type=types.INTERP_NN, dtype=types.FLOAT)
            )
        return (*outs, mask)

    return pipe()


def gathered(cfg, plans, device_id, mesh):
    """Endless batches of the passthrough's cut without DALI (``cut_steps`` steps per call)."""
    path = cfg.data_file("train")
    reader = crop_readers.InMemReader(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
    source = WholeSource(
        plans,
        cut_fn(host_batches.device_volume(reader), device_id, cfg.crop_size, True, cfg, None),
        2,
        cfg.dali_device_cut_steps,
    )
    epoch = 0
    while True:
        plan = plans(epoch)
        for i in range(len(plan)):
            inputs, targets = source(SimpleNamespace(epoch_idx=epoch, iteration=i))
            batch = {"inputs": inputs, "targets": targets, "mask": plan.masks[i].astype(np.float32)}
            yield jax.device_put(batch, distribute.batch_sharding(mesh)) if mesh is not None else batch
        epoch += 1


def batches(cfg, variant: str, device_id, depth: int, mesh=None):
    """Endless batches (inputs, targets, mask) of ``variant`` through DALI's JAX iterator."""
    path = cfg.data_file("train")
    size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
    plans = dp.EpochPlans(cfg, TRAIN, [0], 1, size)
    if variant == "gather":
        yield from gathered(cfg, plans, device_id, mesh)
        return
    sharding = distribute.batch_sharding(mesh) if (mesh is not None and device_id is not None) else None
    it = jdali.make_iterator(
        [pipeline(cfg, variant, plans, device_id, depth)], len(plans(0)) * cfg.global_batch_size, sharding
    )
    while True:  # the iterator ends each epoch and resets itself
        for batch in it:
            if mesh is not None and sharding is None:  # CPU-only pipelines: place like the native loaders
                yield distribute.put_batch({k: np.asarray(v) for k, v in batch.items()}, mesh)
            else:
                yield batch


def check(cfg, variant: str, device_id, steps: int) -> str:
    """Compare ``steps`` batches of ``variant`` with the NumPy reader's, bit for bit."""
    path = cfg.data_file("train")
    reader = crop_readers.InMemReader(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
    plan = host_batches.make_plan(cfg, TRAIN, 0, [0], 1, reader.size)
    it = batches(cfg, variant, device_id, 2)
    seen = set()
    for step in range(min(steps, len(plan))):
        got = next(it)
        want = crop_readers.make_batch(reader, plan.draws[step], cfg)
        seen |= set(int(g) for g in plan.draws[step].symmetries)
        for name, w in zip(("inputs", "targets"), want):
            g = np.asarray(got[name])
            if g.shape != w.shape or g.tobytes() != w.tobytes():
                bad = np.argwhere(g != w)[:1] if g.shape == w.shape else "shape"
                raise SystemExit(f"error: {variant}: step {step} {name} differs from the NumPy reader at {bad}")
    return f"{variant}: {steps} batches equal to the NumPy reader bit for bit ({len(seen)} symmetries)"


def time_io(cfg, it, steps: int) -> float:
    for _ in range(4):  # warm-up: compile the crop function, start DALI
        out = next(it)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = next(it)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def time_full(bench, it, steps: int) -> float:
    out = None
    for _ in range(8):  # warm-up drains DALI's queue
        bench.state, out = bench.train_fn(bench.state, next(it))
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        bench.state, out = bench.train_fn(bench.state, next(it))
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def row(cfg, name: str, mode: str, sec: float, **extra) -> dict:
    return {
        "variant": name,
        "mode": mode,
        "ms_per_batch": 1e3 * sec,
        "samples_per_sec": cfg.global_batch_size / sec,
        "batch": cfg.global_batch_size,
        "config": cfg.name,
        "device": str(jax.devices()[0].device_kind),
        "date": time.strftime("%Y-%m-%d"),
        **extra,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="experiments/dali_iterators/variants.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--depths", nargs="+", type=int, default=[2], help="DALI prefetch queue depths to time")
    p.add_argument("--full", action="store_true", help="also FULL: each variant feeding the train step")
    p.add_argument(
        "--check", type=int, default=0, metavar="STEPS", help="first compare STEPS batches of each variant with NumPy's"
    )
    p.add_argument("--out")
    args = p.parse_args(argv)
    cfg = config_mod.replace(config_cli.config_from_args(args), data_loader_config="dali-device")
    device_id = 0 if jax.default_backend() == "gpu" else None
    if args.check:
        for v in args.variants:
            print(check(cfg, v, device_id, args.check), flush=True)
    rows = []
    bench = None
    if args.full:
        from jax_impl.bench import Bench

        bench = Bench(cfg, "synthetic")
        rows.append(row(cfg, "synthetic", "full", time_full(bench, iter(lambda: bench.batch, None), args.steps)))
    for v in args.variants:
        for depth in args.depths:
            rows.append(row(cfg, v, "io", time_io(cfg, batches(cfg, v, device_id, depth), args.steps), depth=depth))
            if bench is not None:
                it = batches(cfg, v, device_id, depth, bench.mesh)
                rows.append(row(cfg, v, "full", time_full(bench, it, args.steps), depth=depth))
            print(json.dumps(rows[-1]), flush=True)
    synth = next((r["samples_per_sec"] for r in rows if r["variant"] == "synthetic"), None)
    for r in rows:
        ratio = f"{r['samples_per_sec'] / synth:6.3f}x" if synth and r["mode"] == "full" else ""
        print(
            f"{r['variant']:<12} {r['mode']:<5} depth {r.get('depth', '-')!s:<2} {r['ms_per_batch']:8.3f} ms "
            f"{r['samples_per_sec']:10.1f} samples/s {ratio}"
        )
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
