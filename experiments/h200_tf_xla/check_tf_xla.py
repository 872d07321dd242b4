"""TF's exported train step (compiled by JAX's XLA) against JAX's own train step: the first step
from the same canonical weights and batch. JAX only; run on the GPU machine from the checkout's root
with ``PYTHONPATH=.``, or on CPU with a ``cpu_tiny`` export as a smoke test:

    python3 experiments/h200_tf_xla/check_tf_xla.py --config short_opt                  # bf16 export, batch 64
    python3 experiments/h200_tf_xla/check_tf_xla.py --config short_opt --no-enable_amp  # fp32 export
    python3 experiments/h200_tf_xla/check_tf_xla.py --config cpu_tiny --no-enable_amp --tf_xla_export DIR

Weights: ``init_weights(cfg, cfg.seed)``; batch: the benchmarks' synthetic batch; learning rate: the
export's table (step 0). Compared, per canonical weight:

* ``grad``: ||g_tf - g_jax|| / ||g_jax||, each gradient read from its optimizer's first Adam moment
  (m = (1 - beta_1) g after one step from zero, in Keras and optax alike);
* ``update``: ||dW_tf - dW_ref|| / ||dW_ref||, dW_ref = Keras' first Adam step applied to JAX's
  gradient, -lr g / (|g| + eps / sqrt(1 - beta_2)). Keras adds eps to the uncorrected sqrt(v), optax to
  the corrected one, so the two libraries' own updates differ where |g| is near 3e-7; comparing TF's
  update with Keras' rule on JAX's gradient leaves only the gradients' difference. A first Adam step
  is about lr x sign(g): the update differs by 2 lr wherever the two gradients' signs differ, i.e. at
  the near-zero gradients, so this measure grows quickly with the gradients' rounding;
* ``weights``: ||W_tf - W_jax|| / ||W_jax|| after the step, printed, not asserted: it holds the two
  libraries' eps placement, which is large for a zero-initialised bias (W = its update) whose
  gradient is of the order of eps / sqrt(1 - beta_2).

Tolerances (:data:`TOLERANCES`), by the compute precision of the export; loss and update are
asserted everywhere, the gradient in float32. Both programs are compiled by the same XLA with the
same flags; they differ in their graphs (TF's gradient graph and Keras' Adam vs JAX's), so in where
they round and in what order they sum. The bounds leave a wide margin over what the H200 and this
kit's CPU show (experiments/h200_tf_xla/README.md):

* float32 on CPU: loss 1e-5, gradients and updates 1e-3, the bounds of the kit's TF-vs-JAX
  one-step test (tests/test_tf_train.py).
* float32 on a GPU: XLA may run float32 convolutions as TF32 (10-bit mantissa) at DEFAULT
  precision, in both programs, with algorithms autotuned per program: loss 1e-4, gradients and
  updates 2e-3.
* bfloat16 (8-bit mantissa; both keep float32 weights and cast to bf16 for compute, each in its
  own places): loss 1e-4, updates 0.05. A first Adam step is about lr x sign(g), so the update
  measure is 2 sqrt(f) for a share f of flipped signs: 0.05 allows 0.06% of the entries, the
  near-zero gradients. The gradients are printed, not asserted: a bias gradient is a sum over
  B s^3 voxels of bf16 terms, and its rounding depends on where each graph puts the casts; the
  tiny CPU net's biases, whose gradients are small, differ by several percent.

float16 takes bfloat16's tolerances. Exit 0 when every asserted value is within its tolerance, 1
on a mismatch or when XLA cannot compile TF's graph (the error is printed and recorded: a finding
about the TF path), 2 on a user error (missing export, ...).
"""

from __future__ import annotations

import argparse
import datetime
import functools
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
import optax
import tf_xla  # this study's folder; sets the kit's XLA flags before JAX starts a backend
import xla_export as fmt

from dlas_compare.benchmark import append_records
from shared_data.core import config_cli
from shared_data.core.errors import run_cli
from shared_data.data import host_batches
from shared_data.model import unet_spec

from jax_impl import model as model_mod
from jax_impl import step as step_mod

BETA_1, BETA_2, EPS = 0.9, 0.999, 1e-8
# (precision, backend) -> relative tolerances (None: printed, not asserted); the module docstring
# gives the reasons
TOLERANCES = {
    ("float32", "cpu"): {"loss": 1e-5, "grad": 1e-3, "update": 1e-3},
    ("float32", "gpu"): {"loss": 1e-4, "grad": 2e-3, "update": 2e-3},
    ("bfloat16", "cpu"): {"loss": 1e-4, "grad": None, "update": 0.05},
    ("bfloat16", "gpu"): {"loss": 1e-4, "grad": None, "update": 0.05},
}


def tolerances(precision: str, backend: str) -> dict[str, float]:
    """:data:`TOLERANCES` of ``precision`` on ``backend``; float16 takes bfloat16's (more mantissa bits)."""
    return TOLERANCES[("float32" if precision == "float32" else "bfloat16", "cpu" if backend == "cpu" else "gpu")]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norm = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / norm) if norm else float(np.linalg.norm(a))


def jax_first_step(cfg, weights: dict, batch: dict, lr_table: np.ndarray) -> dict:
    """JAX's train step (:func:`jax_impl.step.train_step`) once from ``weights`` and a fresh Adam:
    ``{"loss", "weights", "adam_m"}`` (canonical float32 arrays)."""
    model, tx = model_mod.build_model(cfg), step_mod.make_optimizer(cfg, lr_table)
    state = step_mod.create_train_state(cfg, model_mod.params_from_canonical(weights), tx)
    step = jax.jit(functools.partial(step_mod.train_step, model=model, tx=tx, cfg=cfg))
    state, metrics = step(state, {k: jax.device_put(v) for k, v in batch.items()})
    mu = optax.tree_utils.tree_get(state.opt_state, "mu")
    return {
        "loss": float(metrics["loss"]),
        "weights": model_mod.params_to_canonical(jax.device_get(state.params)),
        "adam_m": model_mod.params_to_canonical(jax.device_get(mu)),
    }


def compare(cfg, tf_out: dict, jax_out: dict, weights: dict, lr: float, tol: dict) -> tuple[list[dict], bool]:
    """Rows ``{"name", "grad", "update", "weights", "ok"}`` per weight plus a ``loss`` row; ``ok`` overall."""
    rows = [
        {"name": "loss", "tf": tf_out["loss"], "jax": jax_out["loss"], "loss": rel(tf_out["loss"], jax_out["loss"])}
    ]
    rows[0]["ok"] = rows[0]["loss"] <= tol["loss"]
    for name in weights:
        g_tf, g_jax = (np.asarray(out["adam_m"][name], np.float64) / (1 - BETA_1) for out in (tf_out, jax_out))
        ref = -lr * g_jax / (np.abs(g_jax) + EPS / np.sqrt(1 - BETA_2))
        row = {
            "name": name,
            "grad": rel(g_tf, g_jax),
            "update": rel(tf_out["weights"][name].astype(np.float64) - weights[name], ref),
            "weights": rel(tf_out["weights"][name], jax_out["weights"][name]),
        }
        row["ok"] = (tol["grad"] is None or row["grad"] <= tol["grad"]) and row["update"] <= tol["update"]
        rows.append(row)
    return rows, all(r["ok"] for r in rows)


def table(rows: list[dict], tol: dict) -> str:
    """The comparison as text: the loss line, then one line per weight."""
    r0 = rows[0]
    grad_tol = "-" if tol["grad"] is None else f"{tol['grad']:.0e}"
    lines = [
        f"loss: TF-XLA {r0['tf']:.8g}  JAX {r0['jax']:.8g}  rel diff {r0['loss']:.2e} (tol {tol['loss']:.0e})"
        f"  {'ok' if r0['ok'] else 'MISMATCH'}",
        f"{'weight':<16}{'grad rel':>11}{'update rel':>12}{'weights rel':>13}",
        f"{'(tolerance)':<16}{grad_tol:>11}{tol['update']:>12.0e}{'-':>13}",
    ]
    for r in rows[1:]:
        lines.append(
            f"{r['name']:<16}{r['grad']:>11.2e}{r['update']:>12.2e}{r['weights']:>13.2e}"
            f"  {'ok' if r['ok'] else 'MISMATCH'}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="experiments/h200_tf_xla/check_tf_xla.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument(
        "--tf_xla_export",
        metavar="DIR",
        help="export folder (default: the config's under experiments/h200_tf_xla/exports)",
    )
    p.add_argument("--out", help="append the result as one JSON line to this file")
    args = p.parse_args(argv)
    cfg = config_cli.config_from_args(args)
    folder = Path(args.tf_xla_export) if args.tf_xla_export else fmt.default_export_dir(cfg)
    program = tf_xla.Program(folder, cfg)
    device = program.device
    tol = tolerances(cfg.precision, device.platform)
    weights = unet_spec.init_weights(cfg, cfg.seed)
    batch = host_batches.synthetic_batch(cfg, program.manifest["global_batch"])
    lr_table = np.asarray(program.manifest["lr_table"], np.float32)
    record = {
        "check": "tf-xla first step vs jax",
        "config": cfg.name,
        "precision": cfg.precision,
        "global_batch": program.manifest["global_batch"],
        "device": f"1 x {getattr(device, 'device_kind', device.platform)}",
        "versions": program.versions(),
        "notes": tf_xla.describe(program.manifest),
        "tolerances": tol,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    print(f"{record['notes']}\n{cfg.name} {cfg.precision} batch {record['global_batch']} on {record['device']}")
    try:
        tf_out = program.first_step(weights, batch)
    except tf_xla.CompileError as err:
        print(f"FAILED: {err}")
        record.update(ok=False, error=str(err))
        if args.out:
            append_records(args.out, [record])
        return 1
    record["compile_sec"] = program.step("train_step").compile_sec
    jax_out = jax_first_step(cfg, weights, batch, lr_table)
    rows, ok = compare(cfg, tf_out, jax_out, weights, float(lr_table[0]), tol)
    print(table(rows, tol))
    print(f"TF's train step compiled in {record['compile_sec']:.1f} s; {'all within tolerance' if ok else 'MISMATCH'}")
    record.update(ok=ok, rows=rows)
    if args.out:
        append_records(args.out, [record])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
