"""Where TF's ``device`` loader loses time on a GPU: the gather alone (host dispatch and device time)
in its forms, and the FULL loop (gather + train step) against the SYNTHETIC loop (cached batch),
with and without dispatching the next batch's gather before the step. JSON lines to ``--out``.

    python experiments/tf_on_h200/device_loader.py --config short_opt --out $OUT/device_loader.jsonl
    python experiments/tf_on_h200/device_loader.py --config cpu_tiny --steps 3 --set train_path=... (CPU smoke test)
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np
import tensorflow as tf

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.data import host_batches

from tf_impl import bench as bench_mod
from tf_impl import data as data_mod
from tf_impl import distribute


def flat_gather_batch(volume, starts, syms, mask, *, size, crop, n_in, perms, signs, src, chan_sign):
    """:func:`tf_impl.data.gather_batch` with one flat index per output value (``tf.gather`` on the
    flattened volume) instead of ``gather_nd`` over stacked (row, column) pairs."""
    p, sg = tf.gather(perms, syms), tf.gather(signs, syms)
    y = tf.range(crop, dtype=tf.int32)[None]
    shapes = [(-1, crop, 1, 1), (-1, 1, crop, 1), (-1, 1, 1, crop)]
    yi = [tf.reshape(tf.where(sg[:, i : i + 1] > 0, y, crop - 1 - y), shapes[i]) for i in range(3)]
    w = [sum(tf.where(tf.reshape(p[:, i], (-1, 1, 1, 1)) == j, yi[i], 0) for i in range(3)) for j in range(3)]
    st = [tf.reshape(starts[:, i], (-1, 1, 1, 1)) for i in range(3)]
    row = ((st[0] + w[0]) * size + (st[1] + w[1])) * size + (st[2] + w[2])
    channels = src.shape[1]
    flat = tf.reshape(volume, [-1])
    ch, ch_sign = tf.gather(src, syms), tf.gather(chan_sign, syms)

    def part(lo, hi):
        idx = row[..., None] * channels + ch[:, None, None, None, lo:hi]
        return tf.gather(flat, idx) * ch_sign[:, None, None, None, lo:hi]

    return {"inputs": part(0, n_in), "targets": part(n_in, channels), "mask": mask}


def wait(out) -> None:
    for t in tf.nest.flatten(out):
        np.asarray(tf.reshape(t, [-1])[:1])


def time_calls(fn, n: int) -> tuple[float, float]:
    """(host ms per call until it returns, ms per call until the device finished), after 3 warm-ups."""
    for _ in range(3):
        out = fn()
    wait(out)
    t0 = time.perf_counter()
    for _ in range(n):
        out = fn()
    t1 = time.perf_counter()
    wait(out)
    t2 = time.perf_counter()
    return 1e3 * (t1 - t0) / n, 1e3 * (t2 - t0) / n


def main() -> None:
    p = argparse.ArgumentParser()
    config_cli.add_config_args(p)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out")
    args = p.parse_args()
    cfg = config_cli.config_from_args(args)
    cfg = config_mod.replace(cfg, data_loader_config="device")
    strategy = distribute.make_strategy(1)
    dev_in = data_mod.DeviceInput(cfg, "train", strategy)
    host, static = host_batches.device_volume(dev_in.reader), host_batches.gather_statics(cfg, dev_in.reader.size)
    records = []

    def record(name, host_ms, device_ms, **extra):
        r = {"what": name, "host_ms": host_ms, "device_ms": device_ms, "config": cfg.name, **extra}
        r["batch"] = len(dev_in.plan(0).draws[0].starts)
        records.append(r)
        print(json.dumps(r), flush=True)

    draws = dev_in.plan(0).draws
    args_host = [(d.starts.astype(np.int32), d.symmetries.astype(np.int32)) for d in draws]
    mask = tf.constant(dev_in.plan(0).masks[0])
    volume_default = dev_in.volumes[0]
    with tf.device("/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"):
        volume_gpu = tf.identity(tf.constant(host))
    print("volume placement: loader's", volume_default.device, "| explicit", volume_gpu.device, flush=True)
    forms = {
        "gather_nd": functools.partial(data_mod.gather_batch, **static),
        "flat gather": functools.partial(flat_gather_batch, **static),
    }
    gathers = {}
    for form, fn in forms.items():
        for jit in (True, False):
            for vname, vol in (("loader's volume", volume_default), ("volume on GPU", volume_gpu)):
                g = tf.function(fn, jit_compile=jit)
                it = iter(range(10**9))

                def call(g=g, vol=vol, it=it):
                    s, y = args_host[next(it) % len(args_host)]
                    return g(vol, tf.constant(s), tf.constant(y), mask)

                gathers[(form, jit, vname)] = call
                h, d = time_calls(call, args.steps)
                record(f"gather {form}, xla {jit}, {vname}", h, d)
    want = tf.function(forms["gather_nd"], jit_compile=True)(
        volume_default, tf.constant(args_host[0][0]), tf.constant(args_host[0][1]), mask
    )
    for key in gathers:
        fn = tf.function(forms[key[0]], jit_compile=key[1])
        vol = volume_default if key[2] == "loader's volume" else volume_gpu
        got = fn(vol, tf.constant(args_host[0][0]), tf.constant(args_host[0][1]), mask)
        same = all(np.array_equal(got[k].numpy(), want[k].numpy()) for k in ("inputs", "targets"))
        print("bit for bit", key, same, flush=True)

    bench = bench_mod.Bench(cfg, "synthetic")
    train_fn, cached = bench.train_fn, bench.batch
    best = min(
        ((k, v) for k, v in gathers.items() if k[1]), key=lambda kv: time_calls(kv[1], max(3, args.steps // 3))[1]
    )
    print("fastest gather:", best[0], flush=True)
    h, d = time_calls(lambda: train_fn(cached), args.steps)
    record("SYNTHETIC loop (cached batch)", h, d, samples_per_sec=bench.global_batch / d * 1e3)
    for label, call in (("production gather", gathers[("gather_nd", True, "loader's volume")]), ("fastest", best[1])):
        h, d = time_calls(lambda call=call: train_fn(call()), args.steps)
        record(f"FULL loop, {label}", h, d, samples_per_sec=bench.global_batch / d * 1e3)
        pending = [call()]

        def ahead(call=call, pending=pending):
            batch = pending.pop()
            pending.append(call())  # the next gather is queued before this step
            return train_fn(batch)

        h, d = time_calls(ahead, args.steps)
        record(f"FULL loop, {label}, next gather dispatched first", h, d, samples_per_sec=bench.global_batch / d * 1e3)
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    print(f"{'what':<62}{'host ms':>9}{'device ms':>11}{'samples/s':>11}")
    for r in records:
        sps = f"{r['samples_per_sec']:.1f}" if "samples_per_sec" in r else "-"
        print(f"{r['what']:<62}{r['host_ms']:>9.2f}{r['device_ms']:>11.2f}{sps:>11}")


if __name__ == "__main__":
    main()
