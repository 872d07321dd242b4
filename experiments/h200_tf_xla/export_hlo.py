"""Export TensorFlow's train and eval steps as StableHLO, for XLA without TensorFlow (the GPU machine):
``python experiments/h200_tf_xla/export_hlo.py --config short_opt [--enable_amp] [--global_batch_size 64] [--out DIR]``.

The steps are the trainer's own (:func:`tf_impl.step.step_functions` with ``jit=True``: the
``tf.function(jit_compile=True)`` that XLA compiles when TF trains), on the model and optimizer
built as :func:`tf_impl.train.train_and_evaluate` builds them, for one replica's batch of the config
(:func:`tf_impl.data.batch_spec`, one replica: the global batch). TF lowers each to the XLA program
it would compile (``experimental_get_compiler_ir(batch)(stage="stablehlo")``); nothing is compiled
or run here. The folder's format, the variable roles and the default folder are
``xla_export.py``'s; ``tf_xla.py`` compiles and runs the files with JAX's XLA.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
import xla_export as fmt  # this study's folder, first on sys.path when a script of it runs

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.config import Config, batch_sizes, steps_per_epoch
from shared_data.core.errors import run_cli
from shared_data.core.files import atomic_path, write_atomic
from shared_data.model import schedule, unet_spec

from tf_impl import data as data_mod
from tf_impl import model as model_mod
from tf_impl import step as step_mod

# Variables of no known role are shipped in values.npz up to this size; the model's and
# optimizer's own variables all have roles, so this only guards against shipping weights.
MAX_STORED_BYTES = 1 << 20


def build_steps(cfg: Config):
    """Model, optimizer and the XLA-compiled per-replica step functions of ``cfg``, as the trainer
    builds them (one replica, canonical initial weights ``init_weights(cfg, cfg.seed)``, the run's LR
    table), and a batch of zeros of the step's shapes; returns ``(model, optimizer, train_fn,
    eval_fn, batch)``. ``batch``: ``inputs`` (B, s, s, s, N_in), ``targets`` (B, s, s, s, N_out),
    ``mask`` (B,), float32, B the global batch."""
    strategy = tf.distribute.get_strategy()
    global_batch, _ = batch_sizes(cfg, 1)
    lr_table = schedule.lr_table(cfg, global_batch, steps_per_epoch(cfg) * cfg.num_epochs)
    with strategy.scope():
        model, optimizer = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, lr_table)
        model_mod.params_from_canonical(model, unet_spec.init_weights(cfg, cfg.seed))
        optimizer.build(model.trainable_variables)
    train_fn, eval_fn = step_mod.step_functions(cfg, strategy, model, optimizer, jit=True)
    batch = {k: tf.zeros(s.shape, s.dtype) for k, s in data_mod.batch_spec(cfg, strategy).items()}
    return model, optimizer, train_fn, eval_fn, batch


def variable_roles(cfg: Config, model: keras.Model, optimizer) -> dict[int, tuple]:
    """``{id(variable handle): (variable, role entry)}`` for the model's and optimizer's variables.

    A role entry is ``{"role": ..., "weight": canonical name}`` for weights and Adam moments, or
    ``{"role": ..., "fill": value}`` for counters and the fp16 loss scale (their values in a fresh
    optimizer); variables of no known role get ``{"role": "stored"}``.
    """
    roles = {}
    for name, layer in model_mod.conv_layers(model).items():
        for leaf in ("kernel", "bias"):
            var = getattr(layer, leaf)
            roles[id(var.handle)] = (var, {"role": "weight", "weight": f"{name}/{leaf}"})
    moments = {}
    for name in _weight_names(cfg):
        key = name.replace("/", "_")
        moments[f"{key}_momentum"] = {"role": "adam_m", "weight": name, "fill": 0}
        moments[f"{key}_velocity"] = {"role": "adam_v", "weight": name, "fill": 0}
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    special = {id(inner.iterations.handle): {"role": "iterations", "fill": 0}}
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        special[id(optimizer.dynamic_scale.handle)] = {"role": "loss_scale", "fill": cfg.loss_scale_init}
        special[id(optimizer.step_counter.handle)] = {"role": "loss_scale_counter", "fill": 0}
    for v in optimizer.variables:
        hid = id(v.handle)
        if hid not in roles:
            roles[hid] = (v, special.get(hid) or moments.get(v.name) or {"role": "stored"})
    for v in model.variables:
        roles.setdefault(id(v.handle), (v, {"role": "stored"}))
    return roles


def _weight_names(cfg: Config) -> list[str]:
    """Canonical weight names of ``cfg``'s net (``down1/kernel``, ``down1/bias``, ...)."""
    return [f"{s.name}/{leaf}" for s in unet_spec.layer_specs(cfg) for leaf in ("kernel", "bias")]


def _keys(flat: dict) -> list[str]:
    """The keys of a flat dict of tensors in ``tf.nest``'s flattening order (sorted), the order of the
    corresponding ``@main`` arguments or results."""
    return tf.nest.flatten({k: k for k in flat})


def describe_step(fn, batch: dict, roles: dict, file: str) -> tuple[str, dict, dict]:
    """The StableHLO text of ``fn`` on ``batch``, its manifest entry and the values of its ``stored``
    variables; checks that ``@main``'s signature is the batch then the captured variables, and that
    every result after the metrics replaces a variable.

    Raises:
        RuntimeError: TF's module does not have that layout, or a variable of no known role is
            larger than :data:`MAX_STORED_BYTES`.
    """
    concrete = fn.get_concrete_function(batch)
    text = fn.experimental_get_compiler_ir(batch)(stage="stablehlo")
    arg_types, result_types = fmt.main_signature(text)
    aliases = fmt.input_output_aliases(text)
    arguments, stored = [], {}
    for name in _keys(batch):
        arguments.append({"kind": "batch", "name": name})
    for t in concrete.captured_inputs:
        if t.dtype == tf.resource:
            if id(t) not in roles:
                raise RuntimeError(f"{file}: a captured variable is neither the model's nor the optimizer's")
            var, role = roles[id(t)]
            entry = {"kind": "variable", "tf_name": var.path, **role}
            if role["role"] == "stored":
                stored[var.path] = np.asarray(var.numpy())
        else:  # a captured tensor (not a variable): its value goes with the export
            name = f"captured_{len(arguments)}"
            entry = {"kind": "variable", "tf_name": name, "role": "stored"}
            stored[name] = t.numpy()
        arguments.append(entry)
    if len(arguments) != len(arg_types):
        raise RuntimeError(f"{file}: @main takes {len(arg_types)} arguments; batch and captures: {len(arguments)}")
    for i, (entry, (shape, dtype)) in enumerate(zip(arguments, arg_types)):
        entry.update(index=i, shape=list(shape), dtype=dtype)
    metrics = _keys(concrete.structured_outputs)
    if sorted(aliases) != list(range(len(metrics), len(result_types))):
        raise RuntimeError(f"{file}: results after the {len(metrics)} metrics are not all variable updates")
    outputs = []
    for i, (shape, dtype) in enumerate(result_types):
        entry = {"index": i, "shape": list(shape), "dtype": dtype}
        if i < len(metrics):
            entry.update(kind="metric", name=metrics[i])
        else:
            arg = arguments[aliases[i]]
            entry.update(kind="update", argument=aliases[i], tf_name=arg["tf_name"], role=arg["role"])
        outputs.append(entry)
    if sum(v.nbytes for v in stored.values()) > MAX_STORED_BYTES:
        raise RuntimeError(f"{file}: variables of no known role {sorted(stored)} are too large to ship")
    return text, {"file": file, "arguments": arguments, "outputs": outputs}, stored


def export(cfg: Config, out: str | Path, built: tuple | None = None) -> dict:
    """Write ``cfg``'s ``train_step.mlir``, ``eval_step.mlir`` and ``manifest.json`` (and
    ``values.npz`` when a variable has no role) into folder ``out``; return the manifest. ``built``:
    the objects of :func:`build_steps` to export (default: built here), so a caller can run TF's
    own steps on the very variables the manifest names. Each file is written atomically, the
    manifest last, so a stopped export leaves the previous manifest, which then no longer matches
    its files (``xla_export.read_manifest`` says so)."""
    out = Path(out)
    model, optimizer, train_fn, eval_fn, batch = built or build_steps(cfg)
    roles = variable_roles(cfg, model, optimizer)
    out.mkdir(parents=True, exist_ok=True)
    steps, stored = {}, {}
    for name, fn in zip(fmt.STEPS, (train_fn, eval_fn)):
        text, entry, values = describe_step(fn, batch, roles, f"{name}.mlir")
        write_atomic(out / entry["file"], text)
        steps[name] = {**entry, "sha256": fmt.sha256(out / entry["file"])}
        stored.update(values)
    if stored:
        with atomic_path(out / fmt.VALUES, suffix=".npz") as tmp:
            np.savez(tmp, **stored)
    elif (out / fmt.VALUES).exists():
        (out / fmt.VALUES).unlink()
    global_batch, local_batch = batch_sizes(cfg, 1)
    lr_table = schedule.lr_table(cfg, global_batch, steps_per_epoch(cfg) * cfg.num_epochs)
    manifest = {
        "format": fmt.FORMAT,
        "what": (
            "TensorFlow's XLA-compiled train and eval steps (tf_impl.step.step_functions, jit_compile=True) "
            "as the StableHLO TensorFlow hands to XLA; variable values not included"
        ),
        "config": cfg.name,
        "precision": cfg.precision,
        "global_batch": global_batch,
        "local_batch": local_batch,
        "replicas": 1,
        "lr_table": [float(x) for x in lr_table],
        "lr_table_note": "TableSchedule's table, a constant of train_step.mlir indexed by the iterations variable",
        "versions": {
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "lowered_for": "GPU" if tf.config.list_logical_devices("GPU") else "CPU",
        },
        "command": fmt.export_command(cfg, out),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "config_values": config_mod.config_dict(cfg),
        "steps": steps,
    }
    write_atomic(out / fmt.MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python experiments/h200_tf_xla/export_hlo.py", description=__doc__.split("\n\n")[0]
    )
    config_cli.add_config_args(p)
    p.add_argument(
        "--out", help="export folder (default: experiments/h200_tf_xla/exports/<config>_<precision>_b<global batch>)"
    )
    args = p.parse_args(argv)
    cfg = config_cli.config_from_args(args)
    out = Path(args.out) if args.out else fmt.default_export_dir(cfg)
    manifest = export(cfg, out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    n_vars = sum(a["kind"] == "variable" for a in manifest["steps"]["train_step"]["arguments"])
    print(f"wrote {out} ({size / 1e6:.2f} MB): train step with {n_vars} variables, eval step, manifest")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
