"""Where TensorFlow's checkpoint save spends its seconds on the training path (``Checkpoints.save``,
asynchronous): the train state of a config (model, Adam's moments, the weight average), saved four times
after a change of its values, with the kit's Keras-variable quirk (``copy``: each Keras variable's host
copy assigned from its tf.Variable's) and with the host copy shared (``alias``), beside a plain
device-to-host read of every variable (``numpy``). Prints one JSON line per variant and a table last.

    PYTHONPATH=. python experiments/tf_checkpoint_path/probe.py --config quality [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
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


def saves(state, quirk, n=4) -> list[float]:
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
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="quality")
    p.add_argument("--out")
    args = p.parse_args()
    cfg = load_config(args.config)
    state = state_of(cfg)
    variables = list(state.model.variables) + list(state.optimizer.variables)
    gb = sum(v.numpy().nbytes for v in variables) / 1e9
    device = tf.config.list_logical_devices("GPU")[0].name if tf.config.list_logical_devices("GPU") else "CPU"
    rows = []
    touch(state)
    t0 = time.perf_counter()
    for v in variables:
        v.numpy()
    rows.append({"variant": "numpy", "seconds": [time.perf_counter() - t0]})
    rows.append({"variant": "copy", "seconds": saves(state, checkpoint_quirks.keras_variables_copied_in_place)})
    rows.append({"variant": "alias", "seconds": saves(state, shared_host_copy)})
    lines = []
    for r in rows:
        r.update(config=args.config, device=device, variables=len(variables), state_gb=round(gb, 3), tf=tf.__version__)
        lines.append(json.dumps(r))
    if args.out:
        write_atomic(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\n{args.config}: {len(variables)} variables, {gb:.2f} GB, {device}, TensorFlow {tf.__version__}")
    print(f"{'variant':8}{'on the path, s (saves 1..n)':>40}{'GB/s (last)':>14}")
    for r in rows:
        s = r["seconds"]
        print(f"{r['variant']:8}{' '.join(f'{x:.3f}' for x in s):>40}{gb / s[-1]:>14.1f}")


if __name__ == "__main__":
    main()
