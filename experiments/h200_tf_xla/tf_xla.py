"""TensorFlow's train step as an XLA program on a machine without TensorFlow: the StableHLO that
``export_hlo.py`` wrote, compiled and run by the XLA of the installed JAX. Imports no TF.

    python experiments/h200_tf_xla/tf_xla.py --config short_opt --enable_amp --out tf_xla.jsonl

times the SYNTHETIC row (the benchmark's record and table, framework ``tf-xla``).

This is TF's XLA graph on the device, without TF's runtime: no executor, no ``tf.data``, no DALI TF
plugin, no ``MirroredStrategy`` (one device), and the compiler is the XLA inside jaxlib, not TF's
own. What it measures is how fast TF's lowering of the step (its gradient graph, Keras' Adam, the
model's formulations) runs, compiled with the same XLA and flags as the JAX rows.

How a module becomes an executable (JAX's internal entry points, ``jax._src``):

* ``interpreters.mlir.make_ir_context()`` + ``ir.Module.parse``: the text, in an MLIR context with
  JAX's dialects (StableHLO, CHLO, MHLO) registered.
* :func:`patch_module`: each ``mhlo.copy`` (TF puts one before every variable update) is replaced by
  its operand, since XLA:GPU's StableHLO path rejects that op ("failed to legalize operation
  'mhlo.copy'"); a copy of a value is that value to a program that returns it. The module's
  ``mhlo.input_output_alias`` is rewritten from the manifest: each updated variable's result aliases
  its argument, so PjRt donates the argument buffer (the input ``jax.Array`` is deleted) and the
  step updates the state in place, as JAX's ``donate_argnums`` does for the JAX row.
* ``compiler.get_compile_options`` (one replica, one partition, the chosen device) and
  ``compiler.backend_compile_and_load`` with the backend of ``xla_bridge.get_backend()``; the
  persistent compilation cache is not consulted, so the compile time is always a cold compile.
* ``LoadedExecutable.execute_sharded(arrays)`` then ``disassemble_into_single_device_arrays()``.

The kit's default XLA flags (:mod:`shared_data.runtime.xla_flags`) are set on import, before JAX starts a
backend, as importing :mod:`jax_impl` does, so both rows compile with the same flags. The
optimizer's iteration counter is int64 in TF; its arrays are made under ``jax.enable_x64(True)``
and need no 64-bit mode elsewhere.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import numpy as np
import xla_export as fmt  # this study's folder, first on sys.path when a script of it runs
from jax._src import compiler, xla_bridge
from jax._src.interpreters import mlir
from jax._src.lib import version_str as jaxlib_version
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir

from dlas_compare import benchmark
from dlas_compare.benchmark_timing import run_bench
from shared_data.core import config_cli
from shared_data.core.config import Config
from shared_data.core.errors import UserError, run_cli
from shared_data.data import host_batches
from shared_data.model import unet_spec
from shared_data.runtime.xla_flags import apply_default_xla_flags

apply_default_xla_flags()  # before JAX starts a backend (importing jax does not start one)
FRAMEWORK = "tf-xla"


class CompileError(RuntimeError):
    """XLA could not compile an exported step for the device: a finding about TF's graph there."""


def describe(manifest: dict) -> str:
    """One sentence saying what the row is, for records and tables."""
    v = manifest["versions"]
    return (
        f"TF's XLA graph (StableHLO exported by TensorFlow {v['tensorflow']}, Keras {v['keras']}), compiled and run "
        f"by the XLA of JAX {jax.__version__}; no TF runtime, no tf.data, no DALI, no MirroredStrategy"
    )


def patch_module(text: str, aliases: Mapping[int, int] | None) -> ir.Module:
    """Parse StableHLO ``text``, drop its ``mhlo.copy`` ops and set its buffer aliasing.

    ``aliases``: ``{result index: argument index}`` whose buffers XLA may share (the argument is then
    donated); ``None`` or empty removes TF's aliasing, so no argument is donated. The module lives in a
    fresh MLIR context of JAX's.
    """
    context = mlir.make_ir_context()
    with context:
        module = ir.Module.parse(text)
        copies = []

        def visit(op):
            if op.name == "mhlo.copy":
                copies.append(op)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
        for op in copies:
            op.results[0].replace_all_uses_with(op.operands[0])
            op.erase()
        attrs = module.operation.attributes
        if "mhlo.input_output_alias" in attrs:
            del attrs["mhlo.input_output_alias"]
        if aliases:
            items = ", ".join(
                f'{{alias = {{kind = "may_alias", parameter_index = array<i64>, parameter_number = {a} : i64}}, '
                f"output_index = array<i64: {o}>}}"
                for o, a in sorted(aliases.items())
            )
            attrs["mhlo.input_output_alias"] = ir.Attribute.parse(f"[{items}]")
    return module


def put(host: list[np.ndarray], device) -> list[jax.Array]:
    """Host arrays onto ``device``, int64 ones staying int64 (made in 64-bit mode)."""
    with jax.enable_x64(True):
        return [jax.device_put(a, device) for a in host]


def compile_module(module: ir.Module, device) -> xc.LoadedExecutable:
    """Compile ``module`` for ``device`` (one replica, one partition) with the backend's XLA."""
    backend = xla_bridge.get_backend(device.platform)
    options = compiler.get_compile_options(1, 1, device_assignment=[device], backend=backend)
    return compiler.backend_compile_and_load(backend, module, xc.DeviceList((device,)), options, [])


class ExportedStep:
    """One exported step (``train_step`` or ``eval_step``) compiled for ``device``.

    Called on ``args`` (``jax.Array``s on ``device``, in ``self.spec["arguments"]`` order) it returns
    the step's results (``self.spec["outputs"]`` order); with ``donate`` the arguments of updated
    variables are donated (deleted) by the call. ``compile_sec``: parse + patch + compile.

    Raises:
        CompileError: the module does not parse, or XLA rejects it for ``device``.
    """

    def __init__(self, folder: Path, manifest: dict, name: str, device, donate: bool = True):
        self.name, self.device, self.spec = name, device, manifest["steps"][name]
        aliases = {o["index"]: o["argument"] for o in self.spec["outputs"] if o["kind"] == "update"}
        t0 = time.perf_counter()
        text = (folder / self.spec["file"]).read_text()
        try:
            self.executable = compile_module(patch_module(text, aliases if donate else None), device)
        except Exception as err:
            raise CompileError(
                f"the XLA of jaxlib {jaxlib_version} could not compile {folder / self.spec['file']} for {device}: "
                f"{' '.join(str(err).split())[:2000]}"
            ) from err
        self.compile_sec = time.perf_counter() - t0

    def __call__(self, args: list[jax.Array]) -> list[jax.Array]:
        results = self.executable.execute_sharded(args)
        return [shards[0] for shards in results.disassemble_into_single_device_arrays()]

    def next_arguments(self, args: list[jax.Array], results: list[jax.Array]) -> list[jax.Array]:
        """``args`` with each updated variable replaced by its new value (the next step's arguments)."""
        args = list(args)
        for o in self.spec["outputs"]:
            if o["kind"] == "update":
                args[o["argument"]] = results[o["index"]]
        return args

    def metrics(self, results: list[jax.Array]) -> dict[str, jax.Array]:
        return {o["name"]: results[o["index"]] for o in self.spec["outputs"] if o["kind"] == "metric"}


class Program:
    """An export folder loaded for one device (default: JAX's first): its manifest, ``values.npz`` and
    its steps, each compiled on first use (:meth:`step`).

    Raises:
        ExportError: the folder is missing, altered, or (with ``cfg``) made for another config.
    """

    def __init__(self, folder: str | Path, cfg: Config | None = None, device=None, donate: bool = True):
        self.folder = Path(folder)
        self.manifest = fmt.read_manifest(self.folder, cfg)
        self.device = device or jax.devices()[0]
        self.donate = donate
        values = self.folder / fmt.VALUES
        self.values = dict(np.load(values)) if values.is_file() else {}
        self._steps: dict[str, ExportedStep] = {}

    def step(self, name: str = "train_step") -> ExportedStep:
        if name not in self._steps:
            self._steps[name] = ExportedStep(self.folder, self.manifest, name, self.device, self.donate)
        return self._steps[name]

    def arguments(self, name: str, weights: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray]) -> list:
        """The device arguments of step ``name``: ``weights`` (canonical, float32) and ``batch``
        (``inputs``, ``targets``, ``mask``, float32) in the export's order, the other variables in the
        state of a fresh optimizer (``xla_export.initial_arguments``)."""
        return put(fmt.initial_arguments(self.manifest["steps"][name], weights, batch, self.values), self.device)

    def first_step(self, weights: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray]) -> dict:
        """TF's first train step from canonical ``weights`` (a fresh optimizer) on ``batch``.

        Returns ``{"loss": float, "metrics": {name: float}, "weights": {...}, "adam_m": {...},
        "adam_v": {...}}``: the updated canonical weights and Adam's moments after the step, float32
        NumPy arrays by canonical name.
        """
        step = self.step("train_step")
        results = step(self.arguments("train_step", weights, batch))
        metrics = {k: float(v) for k, v in step.metrics(results).items()}
        out = {"loss": metrics["loss"], "metrics": metrics}
        for role, key in (("weight", "weights"), ("adam_m", "adam_m"), ("adam_v", "adam_v")):
            out[key] = {w: np.asarray(results[i], np.float32) for w, i in fmt.weight_outputs(step.spec, role).items()}
        return out

    def evaluate(self, weights: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """TF's eval step on ``batch`` with canonical ``weights``: ``{"count": ..., "loss_sum": ...}``."""
        step = self.step("eval_step")
        return {k: float(v) for k, v in step.metrics(step(self.arguments("eval_step", weights, batch))).items()}

    def versions(self) -> dict:
        return {
            "jax": jax.__version__,
            "jaxlib": jaxlib_version,
            "compiler": f"the XLA of jaxlib {jaxlib_version} (not TensorFlow's)",
            "exported_by": self.manifest["versions"],
            "export": str(self.folder),
            "devices": [str(self.device)],
            "backend": self.device.platform,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        }


def first_step(folder: str | Path, weights: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray]) -> dict:
    """:meth:`Program.first_step` of export ``folder`` on the first device."""
    return Program(folder).first_step(weights, batch)


class Bench:
    """SYNTHETIC benchmark of an exported TF train step, timed by :func:`dlas_compare.benchmark_timing.run_bench`:
    the step on one cached device batch, each step's updated variables (donated) fed back as the next step's inputs.
    ``step()`` dispatches one step, ``sync()`` waits for it; ``global_batch`` samples per step.

    Raises:
        UserError: mode ``io`` / ``full``, or more than one device asked for.
        ExportError: the export folder is missing or made for another config (the message says the
            command that makes it).
    """

    framework = FRAMEWORK

    def __init__(self, cfg: Config, mode: str, num_devices: int | None = None, export_dir: str | Path | None = None):
        if mode != "synthetic":
            raise UserError(
                f"--framework {FRAMEWORK} --mode {mode}: only synthetic; the export is TF's step program without "
                f"TF's runtime, so there is no tf.data or DALI TF plugin pipeline to feed IO or FULL"
            )
        if num_devices not in (None, 1):
            raise UserError(
                f"--framework {FRAMEWORK} --num_devices {num_devices}: one device only; the export is one replica's "
                f"step, without MirroredStrategy's gradient all-reduce"
            )
        self.cfg, self.mode, self.replicas = cfg, mode, 1
        self.program = Program(export_dir or fmt.default_export_dir(cfg), cfg)
        self.notes = describe(self.program.manifest)
        self.global_batch = self.program.manifest["global_batch"]
        self.train = self.program.step("train_step")
        self.compile_sec = self.train.compile_sec
        host = host_batches.synthetic_batch(cfg, self.global_batch)
        self.args = self.program.arguments("train_step", unet_spec.init_weights(cfg, cfg.seed), host)
        self._out = None

    def step(self) -> None:
        self._out = self.train(self.args)
        self.args = self.train.next_arguments(self.args, self._out)

    def sync(self) -> None:
        jax.block_until_ready(self._out)

    def peak_memory_bytes(self) -> int | None:
        stats = self.program.device.memory_stats() or {}
        return stats.get("peak_bytes_in_use")

    def versions(self) -> dict:
        return self.program.versions()

    def device_name(self) -> str:
        d = self.program.device
        return f"1 x {getattr(d, 'device_kind', d.platform)}"


def main(argv: Sequence[str] | None = None) -> int:
    """The SYNTHETIC row of an export: :class:`Bench` timed by the benchmark's windows, its record
    appended to ``--out`` and printed as the benchmark's table."""
    p = argparse.ArgumentParser(prog="python experiments/h200_tf_xla/tf_xla.py", description=__doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--tf_xla_export", metavar="DIR", help="export folder (default: the config's under exports/)")
    p.add_argument("--warmup", type=benchmark.int_at_least(0), default=5, help="untimed steps first")
    p.add_argument("--steps", type=benchmark.int_at_least(1), default=10, help="steps per timed window")
    p.add_argument("--windows", type=benchmark.int_at_least(1), default=5, help="timed windows")
    p.add_argument("--label", help="name of this run in the table")
    p.add_argument("--out", help="append the JSON record to this file (JSON lines)")
    args = p.parse_args(argv)
    cfg = config_cli.config_from_args(args)
    bench = Bench(cfg, "synthetic", export_dir=args.tf_xla_export)
    record = run_bench(bench, cfg, "synthetic", args.warmup, args.steps, args.windows, args.label)
    if args.out:
        benchmark.append_records(args.out, [record])
    print(benchmark.table([record]))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
