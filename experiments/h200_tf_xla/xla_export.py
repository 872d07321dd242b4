"""The exported-step format: TensorFlow's XLA-compiled train and eval steps as StableHLO text plus a
manifest, written by ``export_hlo.py`` (TF, any machine) and run by ``tf_xla.py``
(JAX only, e.g. the GPU machine). This module is the contract both sides read; NumPy only.

An export folder (default ``exports/<config>_<precision>_b<global batch>`` in this study's folder;
generated, ignored by git, copied with the working tree to the machine that runs it) holds:

* ``train_step.mlir``, ``eval_step.mlir``: the StableHLO module TF gives for its step function
  (``tf.function(jit_compile=True).experimental_get_compiler_ir(batch)(stage="stablehlo")``). ``@main``
  takes the batch entries (``tf.nest`` order: sorted keys) and then the step's captured variables (the
  order of ``ConcreteFunction.captured_inputs``); it returns the step's metrics (``tf.nest`` order) and
  then the new value of every variable the step assigns. The module attribute
  ``mhlo.input_output_alias`` pairs each new value with the argument it replaces. Weights are
  arguments, not constants, so the files stay small for the 117 M-parameter net.
* ``manifest.json``: per step, every argument in order (``kind`` ``batch`` with the batch key, or
  ``variable`` with TF's variable path and a ``role``), every result (``metric`` with its key, or
  ``update`` with the ``argument`` index it replaces), shapes and dtypes; the config values,
  precision, batch sizes, the learning-rate table TF's graph holds as a constant, the TF and Keras
  versions, the command that made it and a SHA-256 of each ``.mlir`` file.
* ``values.npz``: only for variables of role ``stored`` (none for this kit's model and optimizers).

Variable values are not shipped: :func:`initial_arguments` rebuilds them from the roles.
``weight`` takes the canonical array ``weight`` (:mod:`shared_data.model.unet_spec`; the runner passes
``init_weights(cfg, cfg.seed)`` or any other canonical weights); every other role but ``stored``
has a ``fill`` value (Adam's ``adam_m`` / ``adam_v`` of a weight: 0; the optimizer's ``iterations``:
0; fp16 ``loss_scale``: ``loss_scale_init``; ``loss_scale_counter``: 0), which is the state of
a freshly built optimizer.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from shared_data.core.config import REPO_ROOT, Config, batch_sizes, config_dict
from shared_data.core.errors import UserError

FORMAT = 1
EXPORT_ROOT = Path(__file__).resolve().parent / "exports"
STEPS = ("train_step", "eval_step")
MANIFEST, VALUES = "manifest.json", "values.npz"

#: Config keys that change the exported program (model, batch, loss, precision, optimizer and its
#: learning-rate table); a config that differs from the export's in one of them is
#: refused by :func:`check_config`. The others (data paths, loaders, run folders) do not enter it.
STEP_KEYS = (
    "crop_size",
    "N_in_channels",
    "N_out_channels",
    "unet_widths",
    "full_scale",
    "upconv",
    "downconv",
    "upconv_transpose_below",
    "downconv_strided_below",
    "global_batch_size",
    "local_batch_size",
    "lambda_rho",
    "density_channel",
    "density_scale",
    "enable_amp",
    "amp_dtype",
    "grad_allreduce_dtype",
    "loss_scale_init",
    "loss_scale_period",
    "start_lr",
    "end_lr",
    "lr_schedule",
    "lr_scaling",
    "base_batch_size",
    "warmup_steps",
    "Nsamples",
    "num_epochs",
)

# MLIR element type -> NumPy dtype name
ELEMENT_TYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "ui8": "uint8",
    "ui32": "uint32",
    "ui64": "uint64",
    "i1": "bool",
}


class ExportError(UserError):
    """An export folder is missing, incomplete, altered or made for another config."""


def export_name(cfg: Config) -> str:
    """``<config>_<precision>_b<global batch>``, e.g. ``short_opt_bfloat16_b64``."""
    global_batch, _ = batch_sizes(cfg, 1)
    return f"{cfg.name}_{cfg.precision}_b{global_batch}"


def default_export_dir(cfg: Config) -> Path:
    """The export folder of ``cfg`` in this study's folder: ``exports/<export_name(cfg)>``."""
    return EXPORT_ROOT / export_name(cfg)


def export_command(cfg: Config, out: str | Path | None = None) -> str:
    """The command that writes ``cfg``'s export (``out``: its folder, default :func:`default_export_dir`).

    ``--set`` overrides of keys other than precision and batch are not reproduced: the command names
    the config, its precision flags and the global batch.
    """
    global_batch, _ = batch_sizes(cfg, 1)
    amp = "--no-enable_amp" if not cfg.enable_amp else f"--enable_amp --amp_dtype {cfg.amp_dtype}"
    folder = Path(out) if out is not None else default_export_dir(cfg)
    try:
        folder = folder.resolve().relative_to(REPO_ROOT)
    except ValueError:
        pass
    return (
        f"python experiments/h200_tf_xla/export_hlo.py --config {cfg.name} {amp} --global_batch_size {global_batch} "
        f"--out {shlex.quote(str(folder))}"
    )


def tensor_type(text: str) -> tuple[tuple[int, ...], str]:
    """``"4x16x16xf32"`` (the inside of an MLIR ``tensor<...>``) -> ``((4, 16, 16), "float32")``.

    Raises:
        ValueError: a dynamic dimension or an element type this format does not know.
    """
    *dims, element = text.split("x")
    if element not in ELEMENT_TYPES or not all(d.isdigit() for d in dims):
        raise ValueError(f"tensor<{text}>: expected static dimensions and one of {sorted(ELEMENT_TYPES)}")
    return tuple(int(d) for d in dims), ELEMENT_TYPES[element]


_MAIN = re.compile(
    r"func\.func @main\((?P<args>.*?)\)\s*->\s*(?P<results>\(.*?\)|tensor<[^>]*>)(?:\s+attributes[^{]*)?\s*\{"
)
_ARG = re.compile(r"%arg\d+: tensor<([^>]*)>")
_TENSOR = re.compile(r"tensor<([^>]*)>")
_ALIAS = re.compile(r"parameter_index = array<i64>, parameter_number = (\d+) : i64\}, output_index = array<i64: (\d+)>")


def main_signature(mlir: str) -> tuple[list[tuple], list[tuple]]:
    """Argument and result types of ``@main`` in StableHLO text: two lists of ``(shape, dtype)``.

    Raises:
        ValueError: no ``@main`` function.
    """
    m = _MAIN.search(mlir)
    if m is None:
        raise ValueError("no func.func @main(...) -> (...) in the module")
    return [tensor_type(t) for t in _ARG.findall(m["args"])], [tensor_type(t) for t in _TENSOR.findall(m["results"])]


def input_output_aliases(mlir: str) -> dict[int, int]:
    """The module's ``mhlo.input_output_alias`` as ``{result index: argument index}`` (whole arrays)."""
    head = mlir[: mlir.find("func.func")]
    return {int(out): int(arg) for arg, out in _ALIAS.findall(head)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(folder: str | Path, cfg: Config | None = None) -> dict:
    """The manifest of export ``folder``, its ``.mlir`` files checked against their SHA-256, and,
    when ``cfg`` is given, the export's config checked against it (:func:`check_config`).

    Raises:
        ExportError: the folder or a file is missing, a file differs from the one the manifest
            describes, the format is another, or ``cfg`` differs in a :data:`STEP_KEYS` key; the
            message says the command that (re)makes the export.
    """
    folder = Path(folder)
    remake = (
        export_command(cfg, folder)
        if cfg is not None
        else "python experiments/h200_tf_xla/export_hlo.py --config ... --out DIR"
    )
    path = folder / MANIFEST
    if not path.is_file():
        what = "no export folder" if not folder.exists() else f"no {MANIFEST} in"
        raise ExportError(
            f"{what} {folder}: export TF's steps first, on a machine with TensorFlow: {remake} "
            f"(git ignores the folder: copy it with the working tree to the machine that runs it)"
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise ExportError(f"{path} is not JSON ({err}); re-export: {remake}") from None
    if manifest.get("format") != FORMAT:
        raise ExportError(f"{path}: format {manifest.get('format')!r}, this kit reads {FORMAT}; re-export: {remake}")
    for name, step in manifest["steps"].items():
        mlir = folder / step["file"]
        if not mlir.is_file():
            raise ExportError(f"{folder}: {step['file']} is missing; re-export: {remake}")
        if sha256(mlir) != step["sha256"]:
            raise ExportError(f"{mlir} is not the file {MANIFEST} describes ({name}); re-export: {remake}")
    if cfg is not None:
        check_config(manifest, cfg, folder)
    return manifest


def check_config(manifest: dict, cfg: Config, folder: str | Path = "the export") -> None:
    """Refuse an export made for another program than ``cfg``'s.

    Raises:
        ExportError: a :data:`STEP_KEYS` value of ``cfg`` differs from the export's.
    """
    ours, theirs = config_dict(cfg), manifest["config_values"]
    for key in STEP_KEYS:
        if ours[key] != theirs.get(key):
            raise ExportError(
                f"{folder} was exported for {key}={theirs.get(key)!r} (config {manifest['config']!r}), this run has "
                f"{key}={ours[key]!r}; export this config: {export_command(cfg)}"
            )


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def initial_arguments(
    step: dict,
    weights: Mapping[str, np.ndarray],
    batch: Mapping[str, np.ndarray] | None = None,
    values: Mapping[str, np.ndarray] | None = None,
) -> list[np.ndarray | None]:
    """The host arrays of ``step``'s arguments (``manifest["steps"]["train_step"]``), in order.

    ``weights``: canonical arrays (``"down1/kernel"`` ...), float32; ``batch``: the batch entries
    (``inputs`` (B, s, s, s, N_in), ``targets``, ``mask`` (B,), float32), ``None`` leaves the batch
    arguments ``None``; ``values``: the export's ``values.npz`` for role ``stored``.

    Raises:
        ExportError: a weight or batch entry missing or of another shape than the export's.
    """
    out = []
    for arg in step["arguments"]:
        shape, dtype = tuple(arg["shape"]), _dtype(arg["dtype"])
        if arg["kind"] == "batch":
            value = None if batch is None else batch.get(arg["name"])
            if batch is not None and value is None:
                raise ExportError(f"the batch has no {arg['name']!r}; the export needs {arg['name']} {shape}")
        elif arg["role"] == "weight":
            value = weights.get(arg["weight"])
            if value is None:
                raise ExportError(f"no canonical weight {arg['weight']!r} for TF variable {arg['tf_name']}")
        elif arg["role"] == "stored":
            value = (values or {}).get(arg["tf_name"])
            if value is None:
                raise ExportError(f"{VALUES} has no value for TF variable {arg['tf_name']}")
        else:
            value = np.full(shape, arg["fill"], dtype)
        if value is not None:
            value = np.asarray(value).astype(dtype, copy=False)
            if value.shape != shape:
                what = arg.get("tf_name", arg.get("name"))
                raise ExportError(f"argument {arg['index']} ({what}): shape {value.shape}, the export has {shape}")
        out.append(value)
    return out


def weight_outputs(step: dict, role: str = "weight") -> dict[str, int]:
    """``{canonical weight name: result index}`` of the results that replace variables of ``role``
    (``weight``, ``adam_m`` or ``adam_v``) in ``step``."""
    args = step["arguments"]
    return {
        args[o["argument"]]["weight"]: o["index"]
        for o in step["outputs"]
        if o["kind"] == "update" and args[o["argument"]].get("role") == role
    }
