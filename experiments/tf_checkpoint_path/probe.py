"""Where TensorFlow's checkpoint save spends its seconds on the training path (``Checkpoints.save``,
asynchronous): the train state of a config (model, Adam's moments, the weight average), saved SAVES times
after a change of its values, in one of these variants (one per process: TensorFlow's host memory pools
live as long as the process):

* ``copy``: the kit's save (each Keras variable's host copy assigned from its tf.Variable's);
* ``alias``: the Keras variable's host copy shared with its tf.Variable's (no second host copy);
* ``pregrow``: the kit's save after GROW_GB of pinned host memory was taken once, by a device-to-host
  copy, and released (the gpu_host_bfc pool, which grows region by region, already that large);
* ``numpy``: a plain device-to-host read of every variable, SAVES times;
* ``start_host`` / ``start_device``: the kit's save after the round trip of every variable that
  ``tf_impl.step.compile_steps`` makes around its compile (read to NumPy, assigned back), or the same
  through device copies (``tf.identity``, assigned back), with the round trip's own seconds: what the
  start pays for it, and whether the host round trip grows the pool the saves then use.

Appends one JSON line (the seconds of each save, the copy function's tracing count, the pre-grow's own
seconds) to FILE and prints it.

    PYTHONPATH=. python experiments/tf_checkpoint_path/probe.py --config quality --variant copy [--saves 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from shared_data.core.config import load_config
from shared_data.core.files import write_atomic

from tf_impl import checkpoint_quirks, model, step
from tf_impl.checkpoints import Checkpoints


@contextlib.contextmanager
def shared_host_copy():
    """The Keras variable's host copy is its tf.Variable's host copy itself (no second copy)."""
    from keras.src.backend.tensorflow.core import Variable

    keep = Variable._copy_trackable_to_cpu

    def alias(self, object_map):
        self.value._copy_trackable_to_cpu(object_map)
        object_map[self] = object_map[self.value]

    Variable._copy_trackable_to_cpu = alias
    try:
        yield
    finally:
        Variable._copy_trackable_to_cpu = keep


def state_of(cfg):
    m = model.build_model(cfg)
    opt = step.make_optimizer(cfg, np.full(16, cfg.start_lr, np.float32))
    opt.build(m.trainable_variables)
    return step.TrainState(m, opt)


def touch(state):
    """A new value in every variable, as a train step leaves them (no copy is stale)."""
    for v in list(state.model.trainable_variables) + list(state.optimizer.variables):
        if "float" in str(v.dtype):
            v.assign_add(tf.ones_like(v) * 1e-3)


def tracing_count() -> int | None:
    """Traces of TensorFlow's asynchronous copy function (``AsyncCheckpointHelper._copy_to_cpu``) so far."""
    import gc

    from tensorflow.python.checkpoint import async_checkpoint_helper

    helpers = [o for o in gc.get_objects() if isinstance(o, async_checkpoint_helper.AsyncCheckpointHelper)]
    return sum(h._copy_to_cpu.experimental_get_tracing_count() for h in helpers) if helpers else None


def saves(state, quirk, n: int) -> tuple[list[float], int | None]:
    seconds = []
    with tempfile.TemporaryDirectory() as d, Checkpoints(Path(d) / "ckpt", 2, state) as ckpt:
        checkpoint_quirks.keras_variables_copied_in_place = quirk
        for epoch in range(1, n + 1):
            touch(state)
            np.asarray(state.model.trainable_variables[0][0])  # the updates done before the clock starts
            t0 = time.perf_counter()
            ckpt.save(epoch)
            seconds.append(time.perf_counter() - t0)
            ckpt.wait()
        traces = tracing_count()
    return seconds, traces


def pregrow(gb: float) -> float:
    """Take ``gb`` GB of host memory by one device-to-host copy and release it; its seconds."""
    t0 = time.perf_counter()
    with tf.device("/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"):
        block = tf.zeros([int(gb * 1e9)], tf.uint8)
    with tf.device("/CPU:0"):
        host = tf.identity(block)
    host.numpy()  # the copy done
    del host, block
    return time.perf_counter() - t0


def round_trip(variables, on_device: bool) -> float:
    """Copy every variable (to NumPy, or on the device) and assign it back; its seconds."""
    t0 = time.perf_counter()
    saved = [tf.identity(v) if on_device else v.numpy() for v in variables]
    for v, value in zip(variables, saved):
        v.assign(value)
    np.asarray(variables[-1].numpy().ravel()[:1])  # the assignments done
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="quality")
    variants = ("copy", "alias", "pregrow", "numpy", "start_host", "start_device")
    p.add_argument("--variant", choices=variants, default="copy")
    p.add_argument("--saves", type=int, default=6)
    p.add_argument("--grow_gb", type=float, default=0.0, help="pregrow's size (default: twice the state's)")
    p.add_argument("--out")
    args = p.parse_args()
    cfg = load_config(args.config)
    state = state_of(cfg)
    variables = list(state.model.variables) + list(state.optimizer.variables)
    gb = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables) / 1e9  # no read: it grows pools
    device = tf.config.list_logical_devices("GPU")[0].name if tf.config.list_logical_devices("GPU") else "CPU"
    row = {"variant": args.variant, "config": args.config, "device": device, "variables": len(variables)}
    row.update(state_gb=round(gb, 3), tf=tf.__version__)
    if args.variant == "numpy":
        seconds = []
        for _ in range(args.saves):
            touch(state)
            t0 = time.perf_counter()
            for v in variables:
                v.numpy()
            seconds.append(time.perf_counter() - t0)
        row["seconds"] = seconds
    else:
        if args.variant.startswith("start_"):
            row["round_trip_sec"] = round_trip(variables, args.variant == "start_device")
        if args.variant == "pregrow":
            row["grow_gb"] = args.grow_gb or round(2 * gb, 3)
            row["grow_sec"] = pregrow(row["grow_gb"])
        quirk = shared_host_copy if args.variant == "alias" else checkpoint_quirks.keras_variables_copied_in_place
        row["seconds"], row["traces"] = saves(state, quirk, args.saves)
    line = json.dumps(row)
    if args.out:
        old = Path(args.out).read_text() if Path(args.out).exists() else ""
        write_atomic(args.out, old + line + "\n")
    print(line)


if __name__ == "__main__":
    main()
