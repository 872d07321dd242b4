"""The run configuration: one frozen, typed object loaded from YAML, shared by TF, JAX and the tools.

Configs live in ``configs/UNet.yaml`` as named sections that inherit with YAML merge keys, as in the
NERSC tutorial (``short: {<<: *base, num_epochs: 4}``). The file is flat: every key is a field of
:class:`Config`, so an overlay holds only its differences. Loading checks every key and type and
raises :class:`~shared_data.errors.ConfigError` naming the file, section, key and expected type.

Command-line overrides come in two forms, both applied after the section is loaded:
the tutorial's flags (``--num_epochs 2``, ``--enable_amp``, ...) and a generic ``--set KEY=VALUE``
whose value is parsed as YAML and type-checked like the file. Derived numbers (global/local batch
size, steps per epoch) are computed by functions here, never written back into the config.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Optional

import yaml

from shared_data.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_YAML = REPO_ROOT / "configs" / "UNet.yaml"

LOADERS = ("synthetic", "inmem", "lowmem", "device", "dali-npy", "dali-lowmem", "dali-h5", "dali-device")
CHOICES: dict[str, tuple[str, ...]] = {
    "data_loader_config": LOADERS,
    "symmetry_group": ("cube48", "rotations24", "none"),
    "lr_scaling": ("none", "sqrt", "linear"),
    "lr_schedule": ("cosine", "constant"),
    "amp_dtype": ("bfloat16", "float16"),
    "upconv": ("subpixel", "phases", "transpose"),
    "downconv": ("space_to_depth", "strided"),
    "dali_h5_mode": ("parallel", "prefetch", "simple"),
    "grad_allreduce_dtype": ("float32", "bfloat16"),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """All settings of a run. Field names follow the NERSC tutorial's ``UNet.yaml`` where it has one.

    Paths are relative to the repository root unless absolute. Sizes are in voxels, batch sizes in
    samples, learning rates per step, ``warmup_steps`` in optimizer steps.
    """

    # --- data -------------------------------------------------------------------------------
    train_path: str
    val_path: str
    data_loader_config: str
    num_data_workers: int
    crop_size: int
    Nsamples: int
    Nsamples_val: int
    symmetry_group: str
    nbody_vector_channels: tuple[tuple[int, ...], ...]
    hydro_vector_channels: tuple[tuple[int, ...], ...]
    density_channel: int
    density_scale: float
    seed: int
    synthetic_volume_size: int
    dali_threads: int
    dali_prefetch_queue_depth: int
    dali_h5_mode: str
    # --- model ------------------------------------------------------------------------------
    N_in_channels: int
    N_out_channels: int
    unet_widths: tuple[int, ...]
    full_scale: bool
    upconv: str
    downconv: str
    upconv_transpose_below: int
    downconv_strided_below: int
    # --- training ---------------------------------------------------------------------------
    num_epochs: int
    global_batch_size: int
    local_batch_size: Optional[int]
    start_lr: float
    end_lr: float
    lr_schedule: str
    lr_scaling: str
    base_batch_size: int
    warmup_steps: int
    lambda_rho: float
    enable_amp: bool
    amp_dtype: str
    enable_jit: bool
    grad_allreduce_dtype: str
    loss_scale_init: float
    loss_scale_period: int
    # --- run --------------------------------------------------------------------------------
    exp_dir: str
    keep_checkpoints: int
    tensorboard: bool
    progress_bar: bool
    xla_cache_dir: str
    profile_steps: Optional[tuple[int, ...]]
    # --- bookkeeping (not YAML keys) -------------------------------------------------------
    name: str = "?"
    source: str = "?"

    def resolve_path(self, path: str) -> Path:
        """Return ``path`` made absolute against the repository root (absolute paths unchanged)."""
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else REPO_ROOT / p

    @property
    def precision(self) -> str:
        """``"float32"`` when AMP is off, else ``amp_dtype`` (``"bfloat16"`` or ``"float16"``)."""
        return self.amp_dtype if self.enable_amp else "float32"


_BOOKKEEPING = {"name", "source"}
FIELDS = {f.name: f for f in dataclasses.fields(Config) if f.name not in _BOOKKEEPING}
_HINTS = typing.get_type_hints(Config)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(args[0])} or null"
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the type hint ``tp`` and convert lists to tuples, ints to floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return _coerce(value, inner, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
        inner = typing.get_args(tp)[0]
        return tuple(_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    return float(value) if tp is float else value


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping of config names, got {type(doc).__name__}")
    return doc


def config_names(yaml_path: str | Path = DEFAULT_YAML) -> list[str]:
    """Names of the configs defined in ``yaml_path``."""
    return sorted(_read_yaml(Path(yaml_path)))


def make_config(values: dict, name: str, source: str) -> Config:
    """Build a :class:`Config` from a flat mapping, checking keys, types, choices and ranges.

    Raises:
        ConfigError: unknown or missing key, wrong type, value outside its choices or range.
    """
    where = f"{source} [{name}]"
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(FIELDS))})")
    missing = [k for k in FIELDS if k not in values]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r} ({_type_name(_HINTS[missing[0]])})")
    kwargs = {k: _coerce(values[k], _HINTS[k], f"{where} key {k!r}") for k in FIELDS}
    for key, choices in CHOICES.items():
        if kwargs[key] not in choices:
            raise ConfigError(f"{where} key {key!r}: expected one of {', '.join(choices)}, got {kwargs[key]!r}")
    cfg = Config(**kwargs, name=name, source=source)
    _check_ranges(cfg, where)
    return cfg


def _check_ranges(cfg: Config, where: str) -> None:
    positive = ("num_data_workers", "crop_size", "Nsamples", "Nsamples_val", "N_in_channels",
                "N_out_channels", "global_batch_size", "base_batch_size", "synthetic_volume_size",
                "dali_threads", "dali_prefetch_queue_depth", "keep_checkpoints", "loss_scale_period")
    for key in positive:
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{where} key {key!r}: expected a positive integer, got {getattr(cfg, key)}")
    for key in ("num_epochs", "upconv_transpose_below", "downconv_strided_below"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{where} key {key!r}: expected an integer >= 0, got {getattr(cfg, key)}")
    if cfg.local_batch_size is not None and cfg.local_batch_size < 1:
        raise ConfigError(f"{where} key 'local_batch_size': expected a positive integer or null")
    levels = len(cfg.unet_widths) - (0 if cfg.full_scale else 1)
    if levels < 1 or cfg.crop_size % (2 ** levels):
        raise ConfigError(
            f"{where} key 'crop_size': {cfg.crop_size} must be divisible by 2**{levels} "
            f"(one halving per encoder level of unet_widths={list(cfg.unet_widths)}, full_scale={cfg.full_scale})")
    for key, n in (("nbody_vector_channels", cfg.N_in_channels), ("hydro_vector_channels", cfg.N_out_channels)):
        for triplet in getattr(cfg, key):
            if len(triplet) != 3 or not all(0 <= c < n for c in triplet):
                raise ConfigError(f"{where} key {key!r}: expected triplets of channel indices in [0, {n}), got {list(triplet)}")
    if not 0 <= cfg.density_channel < cfg.N_out_channels:
        raise ConfigError(f"{where} key 'density_channel': expected an index in [0, {cfg.N_out_channels})")
    for key in ("start_lr", "end_lr", "loss_scale_init"):
        value = getattr(cfg, key)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where} key {key!r}: expected a finite number >= 0, got {value}")
    if cfg.profile_steps is not None and (len(cfg.profile_steps) != 2 or not 0 <= cfg.profile_steps[0] < cfg.profile_steps[1]):
        raise ConfigError(f"{where} key 'profile_steps': expected [start, stop) with 0 <= start < stop, got {list(cfg.profile_steps)}")
    if cfg.grad_allreduce_dtype == "bfloat16" and cfg.precision != "bfloat16":
        # JAX sums the gradients its bf16 convolutions produce; with float32 or float16 compute it
        # would have to round the weights themselves, so the frameworks agree on this rule
        raise ConfigError(f"{where} key 'grad_allreduce_dtype': bfloat16 needs bfloat16 compute "
                          f"(enable_amp: true, amp_dtype: bfloat16), got precision {cfg.precision}")


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``KEY=VALUE`` and parse VALUE as YAML (``8`` -> int, ``[4,8]`` -> list, ``null`` -> None).

    Raises:
        ConfigError: no ``=``, or an unknown key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in FIELDS:
        raise ConfigError(f"override {text!r}: unknown key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(name: str, yaml_path: str | Path = DEFAULT_YAML, overrides: dict | None = None) -> Config:
    """Load config ``name`` from ``yaml_path`` and apply ``overrides`` (key -> value).

    Raises:
        ConfigError: missing file or name, unknown key, wrong type or value (message names which).
    """
    path = Path(yaml_path)
    doc = _read_yaml(path)
    if name not in doc:
        raise ConfigError(f"config {name!r} not found in {path} (available: {', '.join(sorted(doc))})")
    section = doc[name]
    if not isinstance(section, dict):
        raise ConfigError(f"{path} [{name}]: expected a mapping of keys, got {type(section).__name__}")
    values = dict(section)
    source = str(path)
    if overrides:
        unknown = sorted(set(overrides) - set(FIELDS))
        if unknown:
            raise ConfigError(f"override: unknown key {unknown[0]!r}")
        values.update(overrides)
        source = f"{path} + overrides {sorted(overrides)}"
    return make_config(values, name, source)


def replace(cfg: Config, **changes: Any) -> Config:
    """Return a copy of ``cfg`` with ``changes`` applied and checked like a file's keys."""
    values = {k: getattr(cfg, k) for k in FIELDS}
    values.update(changes)
    return make_config(values, cfg.name, cfg.source)


def config_dict(cfg: Config) -> dict:
    """The YAML keys of ``cfg`` as plain Python values (lists, not tuples), for logs and checkpoints."""
    def plain(v: Any) -> Any:
        return [plain(x) for x in v] if isinstance(v, tuple) else v
    return {k: plain(getattr(cfg, k)) for k in FIELDS}


# --- derived values ---------------------------------------------------------------------------

def batch_sizes(cfg: Config, num_replicas: int = 1) -> tuple[int, int]:
    """Return ``(global_batch_size, local_batch_size)`` for ``num_replicas`` data-parallel replicas.

    As in the tutorial: an explicit ``local_batch_size`` wins and the global batch is
    ``local x replicas``; otherwise ``global_batch_size`` is split evenly over the replicas.

    Raises:
        ConfigError: the global batch does not divide over the replicas.
    """
    if cfg.local_batch_size is not None:
        return cfg.local_batch_size * num_replicas, cfg.local_batch_size
    if cfg.global_batch_size % num_replicas:
        raise ConfigError(
            f"config {cfg.name!r}: global_batch_size {cfg.global_batch_size} does not divide over "
            f"{num_replicas} replicas; set local_batch_size or a multiple of {num_replicas}")
    return cfg.global_batch_size, cfg.global_batch_size // num_replicas


def steps_per_epoch(cfg: Config, num_replicas: int = 1) -> int:
    """Optimizer steps per epoch: ``Nsamples // global_batch_size`` (the last partial batch is dropped).

    Raises:
        ConfigError: ``Nsamples`` is smaller than one global batch.
    """
    global_bs, _ = batch_sizes(cfg, num_replicas)
    if cfg.Nsamples < global_bs:
        raise ConfigError(f"config {cfg.name!r}: Nsamples {cfg.Nsamples} is smaller than one global batch ({global_bs})")
    return cfg.Nsamples // global_bs


def val_steps(cfg: Config, num_replicas: int = 1) -> int:
    """Validation steps: ``ceil(Nsamples_val / global_batch_size)``; the last batch is padded and masked."""
    global_bs, _ = batch_sizes(cfg, num_replicas)
    return -(-cfg.Nsamples_val // global_bs)


# --- command line ------------------------------------------------------------------------------

def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--yaml_config``, ``--config``, the tutorial's flags and ``--set KEY=VALUE`` to ``parser``."""
    g = parser.add_argument_group("configuration")
    g.add_argument("--yaml_config", default=str(DEFAULT_YAML), help="YAML file of named configs (default: %(default)s)")
    g.add_argument("--config", default="cpu_default", help="config name in the YAML file (default: %(default)s)")
    g.add_argument("--num_epochs", type=int, help="override num_epochs")
    g.add_argument("--global_batch_size", type=int, help="override global_batch_size")
    g.add_argument("--local_batch_size", type=int, help="per-replica batch; global = local x replicas")
    g.add_argument("--num_data_workers", type=int, help="override num_data_workers")
    g.add_argument("--data_loader_config", choices=LOADERS, help="input pipeline")
    g.add_argument("--enable_amp", action="store_true", default=None, help="mixed precision (amp_dtype, bfloat16 by default)")
    g.add_argument("--amp_dtype", choices=CHOICES["amp_dtype"], help="half type used when AMP is on")
    g.add_argument("--enable_jit", type=_parse_bool, metavar="{true,false}", help="XLA compilation of the train step (TF); JAX always compiles")
    g.add_argument("--Nsamples", type=int, help="training crops per epoch")
    g.add_argument("--exp_dir", help="root folder of runs (checkpoints, logs)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key; VALUE is YAML (e.g. --set unet_widths=[8,16] --set lambda_rho=0.1)")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_FLAG_KEYS = ("num_epochs", "global_batch_size", "local_batch_size", "num_data_workers", "data_loader_config",
              "enable_amp", "amp_dtype", "enable_jit", "Nsamples", "exp_dir")


def config_from_args(args: argparse.Namespace) -> Config:
    """Load the config named by parsed ``args`` and apply its flag and ``--set`` overrides."""
    if getattr(args, "global_batch_size", None) is not None and getattr(args, "local_batch_size", None) is not None:
        raise ConfigError("--global_batch_size and --local_batch_size conflict: give one (global = local x replicas)")
    overrides = dict(parse_override(s) for s in args.set)
    for key in _FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            overrides[key] = value
    return load_config(args.config, args.yaml_config, overrides)
