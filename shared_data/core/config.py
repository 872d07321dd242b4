"""The run configuration: one frozen, typed object loaded from YAML, shared by TF, JAX and the tools.

Configs live in ``configs/UNet.yaml`` (shipped inside the installed package; ``--yaml_config`` takes
any other file) as named sections that inherit with YAML merge keys, as in the NERSC tutorial
(``short: {<<: *base, num_epochs: 4}``). The file is flat: every key is a field of :class:`Config`,
so an overlay holds only its differences. Loading checks every key, type and range and raises
:class:`~shared_data.core.errors.ConfigError` naming the file, section, key and expected value.

The tutorial's own ``config/UNet.yaml`` loads unchanged: a section in its format (``data_size``,
``expdir``, a nested ``lr_schedule``, ...) is translated key by key, every tutorial key either mapped
to ours or reported as not applicable (:attr:`Config.notes`, logged by the trainers), and the keys
it does not have take this kit's ``base`` values.

Relative paths resolve against the current folder; ``data_dir`` (``--data_dir``), when set, is the
folder the data paths are relative to instead.

Command-line overrides come in two forms, both applied after the section is loaded:
the tutorial's flags (``--num_epochs 2``, ``--enable_amp``, ...) and a generic ``--set KEY=VALUE``
whose value is parsed as YAML and type-checked like the file. Derived numbers (global/local batch
size, steps per epoch) are computed by functions here, never written back into the config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from shared_data.core.errors import ConfigError, did_you_mean
from shared_data.core.loader_kinds import NAMES as LOADERS

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_ROOT.parent


def _shipped_yaml() -> Path:
    """``configs/UNet.yaml`` of the checkout, or its installed copy ``shared_data/configs/UNet.yaml``
    (the wheel maps the top-level folder there, a name that cannot collide with a user's ``configs``)."""
    installed = PACKAGE_ROOT / "configs" / "UNet.yaml"
    return installed if installed.is_file() else REPO_ROOT / "configs" / "UNet.yaml"


DEFAULT_YAML = _shipped_yaml()
CHOICES: dict[str, tuple[str, ...]] = {
    "data_loader_config": LOADERS,
    "symmetry_group": ("cube48", "rotations24", "none"),
    "lr_scaling": ("none", "sqrt", "linear"),
    "lr_schedule": ("cosine", "constant"),
    "amp_dtype": ("bfloat16", "float16"),
    "upconv": ("subpixel", "subpixel_crop", "phases", "transpose"),
    "downconv": ("space_to_depth", "strided"),
    "conv_pad": ("separate", "folded"),
    "kernel_regroup": ("gather", "transpose"),
    "skip_concat": ("concat", "split"),
    "adam_update": ("per_tensor", "flat"),
    "dali_h5_mode": ("parallel", "prefetch", "simple"),
    "grad_allreduce_dtype": ("float32", "bfloat16"),
    "loss_space": ("log", "physical"),
    "loss_norm": ("l1", "l2"),
    "fourier_channels": ("all", "scored"),
}


@dataclasses.dataclass(frozen=True)
class Config:
    """All settings of a run. Field names follow the NERSC tutorial's ``UNet.yaml`` where it has one.

    Relative paths resolve against the current folder (data paths against ``data_dir`` when set).
    Sizes are in voxels, batch sizes in samples, learning rates per step, ``warmup_steps`` in
    optimizer steps.
    """

    # --- data -------------------------------------------------------------------------------
    train_path: str
    val_path: str
    data_dir: str | None
    train_path_npy_data: str | None
    train_path_npy_label: str | None
    val_path_npy_data: str | None
    val_path_npy_label: str | None
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
    temperature_channel: int
    temperature_scale: float
    seed: int
    synthetic_volume_size: int
    dali_threads: int
    dali_prefetch_queue_depth: int
    dali_device_cut_steps: int
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
    conv_pad: str
    kernel_regroup: str
    skip_concat: str
    pad_out_channels: int
    # --- training ---------------------------------------------------------------------------
    num_epochs: int
    global_batch_size: int
    local_batch_size: int | None
    start_lr: float
    end_lr: float
    lr_schedule: str
    lr_scaling: str
    base_batch_size: int
    warmup_steps: int
    lambda_rho: float
    lambda_fourier: float
    fourier_channels: str
    loss_space: str
    loss_norm: str
    ema_decay: float
    enable_amp: bool
    amp_dtype: str
    enable_jit: bool
    grad_allreduce_dtype: str
    adam_update: str
    loss_scale_init: float
    loss_scale_period: int
    # --- run --------------------------------------------------------------------------------
    exp_dir: str
    keep_checkpoints: int
    tensorboard: bool
    progress_bar: bool
    xla_cache_dir: str
    profile_steps: tuple[int, ...] | None
    enable_manual_profiling: bool
    # --- time to quality (shared_data.inference.quality) --------------------------------------
    quality_every_epochs: int
    quality_r_min: float
    quality_ratio_tol: float
    quality_temperature_r_min: float | None
    quality_temperature_ratio_tol: float | None
    quality_k_max: float
    quality_beat_baseline: bool
    quality_beat_non_ml: bool
    quality_budget_sec: float
    # --- bookkeeping (not YAML keys) -------------------------------------------------------
    name: str = "?"
    source: str = "?"
    notes: tuple[str, ...] = ()

    def resolve_path(self, path: str) -> Path:
        """``path`` made absolute against the current folder (``~`` expanded; absolute paths unchanged)."""
        return Path(os.path.expanduser(path)).absolute()

    def _data_path(self, path: str) -> Path:
        p = Path(os.path.expanduser(path))
        if self.data_dir and not p.is_absolute():
            p = Path(os.path.expanduser(self.data_dir)) / p
        return p.absolute()

    def data_file(self, split: str) -> Path:
        """The HDF5 file of ``split`` (``"train"`` or ``"val"``), absolute."""
        return self._data_path(self.train_path if split == "train" else self.val_path)

    def npy_files(self, split: str) -> tuple[Path, Path]:
        """The DHWC ``.npy`` twins (Nbody, Hydro) that DALI's numpy reader reads for ``split``: the
        ``*_path_npy_data`` / ``*_path_npy_label`` keys when set, else ``<stem>_Nbody.npy`` /
        ``<stem>_Hydro.npy`` beside the HDF5 file."""
        data, label = (getattr(self, f"{split}_path_npy_{k}") for k in ("data", "label"))
        h5 = self.data_file(split)
        stem = h5.with_suffix("")
        return (
            self._data_path(data) if data else Path(f"{stem}_Nbody.npy"),
            self._data_path(label) if label else Path(f"{stem}_Hydro.npy"),
        )

    def data_inputs(self) -> dict[str, Path]:
        """Every data file a run of this config may read, keyed by how the user names it: the
        training and validation volumes and their ``.npy`` twins (:meth:`npy_files`)."""
        inputs = {}
        for split in ("train", "val"):
            inputs[f"{split}_path"] = self.data_file(split)
            for key, npy in zip(("Nbody", "Hydro"), self.npy_files(split)):
                inputs[f"the {key} .npy twin of {split}_path"] = npy
        return inputs

    @property
    def precision(self) -> str:
        """``"float32"`` when AMP is off, else ``amp_dtype`` (``"bfloat16"`` or ``"float16"``)."""
        return self.amp_dtype if self.enable_amp else "float32"


_BOOKKEEPING = {"name", "source", "notes"}
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
    if tp is float and isinstance(value, str):
        value = _float_text(value, tp, where)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    return float(value) if tp is float else value


def _float_text(text: str, tp: Any, where: str) -> float:
    """A number written as text that YAML 1.1 leaves a string (``1e-3``, ``2E-4``): parse it."""
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {text!r}") from None


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text file, expected YAML") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read ({err.strerror})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping of config names, got {type(doc).__name__}")
    return doc


def config_names(yaml_path: str | Path = DEFAULT_YAML) -> list[str]:
    """Names of the configs defined in ``yaml_path``."""
    return sorted(_read_yaml(Path(yaml_path)))


def make_config(values: dict, name: str, source: str, notes: tuple[str, ...] = ()) -> Config:
    """Build a :class:`Config` from a flat mapping, checking keys, types, choices and ranges.

    Raises:
        ConfigError: unknown or missing key, wrong type, value outside its choices or range.
    """
    where = f"{source} [{name}]"
    unknown = sorted(str(k) for k in set(values) - set(FIELDS))  # a YAML key may be a number or null
    if unknown:
        hint = did_you_mean(unknown[0], FIELDS) or f" (known keys: {', '.join(sorted(FIELDS))})"
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{hint}")
    missing = [k for k in FIELDS if k not in values]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r} ({_type_name(_HINTS[missing[0]])})")
    kwargs = {k: _coerce(values[k], _HINTS[k], f"{where} key {k!r}") for k in FIELDS}
    for key, choices in CHOICES.items():
        if kwargs[key] not in choices:
            raise ConfigError(f"{where} key {key!r}: expected one of {', '.join(choices)}, got {kwargs[key]!r}")
    cfg = Config(**kwargs, name=name, source=source, notes=notes)
    _check_ranges(cfg, where)
    return cfg


#: The lower bound of every numeric key: ``(minimum, inclusive)``; floats must also be finite. The
#: keys whose range depends on other keys (channel indices, crop divisibility) are checked below.
RANGES: dict[str, tuple[float, bool]] = {
    **{
        k: (1, True)
        for k in (
            "num_data_workers",
            "crop_size",
            "Nsamples",
            "Nsamples_val",
            "N_in_channels",
            "N_out_channels",
            "global_batch_size",
            "local_batch_size",
            "base_batch_size",
            "synthetic_volume_size",
            "dali_threads",
            "dali_prefetch_queue_depth",
            "dali_device_cut_steps",
            "keep_checkpoints",
            "loss_scale_period",
            "unet_widths",
        )
    },
    **{
        k: (0, True)
        for k in (
            "seed",
            "num_epochs",
            "upconv_transpose_below",
            "downconv_strided_below",
            "pad_out_channels",
            "warmup_steps",
            "start_lr",
            "end_lr",
            "lambda_rho",
            "lambda_fourier",
            "ema_decay",
            "quality_every_epochs",
            "quality_ratio_tol",
            "quality_temperature_ratio_tol",
            "quality_budget_sec",
            "temperature_channel",
        )
    },
    "quality_r_min": (-1, True),
    "quality_temperature_r_min": (-1, True),
    **{k: (0, False) for k in ("density_scale", "temperature_scale", "loss_scale_init", "quality_k_max")},
}

#: The upper bound of each size-like key: far above any run of this kit, low enough that what is sized
#: by it (crop plans, the learning-rate table, buffers) is built in seconds. The product of
#: ``num_epochs`` and the steps per epoch is bounded too (:data:`MAX_TOTAL_STEPS`).
MAXIMA: dict[str, int] = {
    "Nsamples": 2**24,
    "Nsamples_val": 2**24,
    "num_epochs": 10**6,
    "global_batch_size": 2**16,
    "local_batch_size": 2**16,
    "base_batch_size": 2**16,
    "crop_size": 1024,
    "synthetic_volume_size": 4096,
    "num_data_workers": 1024,
    "dali_threads": 1024,
    "dali_prefetch_queue_depth": 1024,
    "keep_checkpoints": 10**4,
    "warmup_steps": 10**6,
    "unet_widths": 2**16,
    "pad_out_channels": 256,
    "quality_every_epochs": 10**6,
}
#: The most optimizer steps one run may take: one learning-rate entry each, built at start.
MAX_TOTAL_STEPS = 10**6


def _check_ranges(cfg: Config, where: str) -> None:
    for key, (minimum, inclusive) in RANGES.items():
        value = getattr(cfg, key)
        for v in value if isinstance(value, tuple) else (value,):
            if v is None:
                continue
            ok = math.isfinite(v) and (v >= minimum if inclusive else v > minimum)
            if not ok:
                kind = "an integer" if isinstance(v, int) else "a finite number"
                raise ConfigError(
                    f"{where} key {key!r}: expected {kind} {'>=' if inclusive else '>'} {minimum}, "
                    f"got {value if not isinstance(value, tuple) else list(value)}"
                )
            if key in MAXIMA and v > MAXIMA[key]:
                raise ConfigError(f"{where} key {key!r}: expected at most {MAXIMA[key]}, got {v}")
    levels = len(cfg.unet_widths) - (0 if cfg.full_scale else 1)
    if levels < 1 or cfg.crop_size % (2**levels):
        raise ConfigError(
            f"{where} key 'crop_size': {cfg.crop_size} must be divisible by 2**{levels} "
            f"(one halving per encoder level of unet_widths={list(cfg.unet_widths)}, full_scale={cfg.full_scale})"
        )
    for key, n in (("nbody_vector_channels", cfg.N_in_channels), ("hydro_vector_channels", cfg.N_out_channels)):
        for triplet in getattr(cfg, key):
            if len(triplet) != 3 or not all(0 <= c < n for c in triplet):
                raise ConfigError(
                    f"{where} key {key!r}: expected triplets of channel indices in [0, {n}), got {list(triplet)}"
                )
    if not 0 <= cfg.density_channel < cfg.N_out_channels:
        raise ConfigError(
            f"{where} key 'density_channel': expected an index in [0, {cfg.N_out_channels}), got {cfg.density_channel}"
        )
    if not 0 <= cfg.temperature_channel < cfg.N_out_channels or cfg.temperature_channel == cfg.density_channel:
        raise ConfigError(
            f"{where} key 'temperature_channel': expected an index in [0, {cfg.N_out_channels}) other than "
            f"density_channel {cfg.density_channel}, got {cfg.temperature_channel}"
        )
    if cfg.ema_decay >= 1.0:
        raise ConfigError(f"{where} key 'ema_decay': expected a number in [0, 1) (0: off), got {cfg.ema_decay}")
    for key in ("quality_r_min", "quality_temperature_r_min"):
        if (getattr(cfg, key) or 0.0) > 1.0:
            raise ConfigError(f"{where} key {key!r}: expected a number in [-1, 1], got {getattr(cfg, key)}")
    if cfg.profile_steps is not None and (
        len(cfg.profile_steps) != 2 or not 0 <= cfg.profile_steps[0] < cfg.profile_steps[1]
    ):
        raise ConfigError(
            f"{where} key 'profile_steps': expected [start, stop) with 0 <= start < stop, got {list(cfg.profile_steps)}"
        )
    if cfg.grad_allreduce_dtype == "bfloat16" and cfg.precision != "bfloat16":
        # JAX sums the gradients its bf16 convolutions produce; with float32 or float16 compute it
        # would have to round the weights themselves, so the frameworks agree on this rule
        raise ConfigError(
            f"{where} key 'grad_allreduce_dtype': bfloat16 needs bfloat16 compute "
            f"(enable_amp: true, amp_dtype: bfloat16), got precision {cfg.precision}"
        )


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
        raise ConfigError(f"override {text!r}: unknown key {key!r}{did_you_mean(key, FIELDS)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


# The tutorial's UNet.yaml keys that are not ours, each mapped to our key(s) or not applicable here.
TUTORIAL_ONLY = ("data_size", "expdir", "weight_init", "box_size", "enable_apex", "enable_benchy", "use_cache")
_NOT_APPLICABLE = {
    "enable_apex": "Adam already runs fused inside the compiled step (optax / Keras under XLA)",
    "enable_benchy": "the benchmark command runs benchy's IO / SYNTHETIC / FULL modes "
    "(python -m dlas_compare.benchmark --mode io synthetic full, or the trainer's --enable_benchy)",
    "box_size": "volume sides are read from the HDF5 files",
    "use_cache": "point train_path / val_path (or --data_dir) at the cached copy",
}
_TUTORIAL_INIT = {"conv_init": "normal", "conv_scale": 0.02, "conv_bias": 0.0}


def is_tutorial_section(section: dict) -> bool:
    """Whether a config section is in the NERSC tutorial's format (a key of its own, or a nested
    ``lr_schedule``)."""
    return any(k in section for k in TUTORIAL_ONLY) or isinstance(section.get("lr_schedule"), dict)


#: The tutorial's keys that hold one of this kit's keys under another name (``lr_schedule``'s entries
#: are ``lr_schedule.<entry>``).
_TUTORIAL_NAMES = {
    "data_size": "crop_size",
    "expdir": "exp_dir",
    "lr_schedule.scaling": "lr_scaling",
    "lr_schedule.start_lr": "start_lr",
    "lr_schedule.end_lr": "end_lr",
    "lr_schedule.warmup_steps": "warmup_steps",
}
#: The types of the tutorial's keys that have no counterpart here (checked, then reported as not
#: applicable), as :func:`_coerce` reads them.
_TUTORIAL_TYPES = {"enable_apex": bool, "enable_benchy": bool, "box_size": tuple[float, ...]}


def _tutorial_value(key: str, value: Any, where: str) -> Any:
    """``value`` of tutorial key ``key`` (``data_size``, ``lr_schedule.start_lr``, ...) checked against the
    type of this kit's key it maps to, the error naming the tutorial's key."""
    ours = _TUTORIAL_NAMES[key]
    return _coerce(value, _HINTS[ours], f"{where} key {key!r} (this kit's {ours})")


def _tutorial_mapping(key: str, value: Any, entries, where: str) -> dict:
    """The tutorial's nested ``key`` (``lr_schedule``, ``weight_init``): a mapping with only ``entries``.

    Raises:
        ConfigError: not a mapping, or an entry that is not one of ``entries``.
    """
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} key {key!r}: expected a mapping of {', '.join(entries)} (the tutorial's form), got {value!r}"
        )
    unknown = [k for k in value if k not in entries]
    if unknown:
        raise ConfigError(f"{where} key {key!r}: unknown entry {unknown[0]!r} (expected {', '.join(entries)})")
    return value


def translate_tutorial(section: dict, where: str, defaults: dict) -> tuple[dict, list[str]]:
    """Map a tutorial-format section onto this kit's keys; return ``(values, notes)``, one note per
    tutorial key (mapped or not applicable) and one for the keys taken from ``defaults``. An absolute
    ``expdir`` (the tutorial container's ``/logs``) becomes the kit's ``exp_dir`` under the current
    folder, so a run writes nothing outside it. A tutorial key's value is checked against the type of
    the key it maps to (:data:`_TUTORIAL_NAMES`, :data:`_TUTORIAL_TYPES`); the error names the tutorial's key.

    Raises:
        ConfigError: a tutorial value of the wrong type (``weight_init: normal``, ``data_size: [64]``) or
            one this kit cannot honour (another weight init, an unknown ``lr_schedule`` entry).
    """
    values, notes = {}, []
    for key, value in section.items():
        value = None if value == "None" else value  # the tutorial's YParams reads 'None' as None
        if key in ("data_size", "expdir"):
            value = _tutorial_value(key, value, where)
        if key == "data_size":
            values["crop_size"] = value
            notes.append(f"tutorial key 'data_size' -> crop_size = {value}")
        elif key == "expdir" and os.path.isabs(os.path.expanduser(value)):
            # the tutorial's container folder (e.g. /logs): runs stay under the current folder
            values["exp_dir"] = defaults["exp_dir"]
            notes.append(
                f"tutorial key 'expdir' = {value} is an absolute folder of the tutorial's container: "
                f"runs go to exp_dir = {defaults['exp_dir']} here (--exp_dir or --workdir to choose)"
            )
        elif key == "expdir":
            values["exp_dir"] = value
            notes.append(f"tutorial key 'expdir' -> exp_dir = {value}")
        elif key == "lr_schedule" and not isinstance(value, str):
            entries = [k.split(".", 1)[1] for k in _TUTORIAL_NAMES if k.startswith("lr_schedule.")]
            schedule = _tutorial_mapping(key, value, entries, where)
            for k, v in schedule.items():
                values[_TUTORIAL_NAMES[f"lr_schedule.{k}"]] = _tutorial_value(f"lr_schedule.{k}", v, where)
            values["lr_schedule"] = "cosine"
            notes.append(
                "tutorial key 'lr_schedule' -> lr_schedule = cosine, "
                + ", ".join(f"{_TUTORIAL_NAMES['lr_schedule.' + k]} = {v}" for k, v in schedule.items())
            )
        elif key == "weight_init":
            given = {} if value is None else value  # 'None': the tutorial's defaults
            init = dict(_TUTORIAL_INIT, **_tutorial_mapping(key, given, list(_TUTORIAL_INIT), where))
            if init != _TUTORIAL_INIT:
                raise ConfigError(
                    f"{where} key 'weight_init': {value} is not supported; this kit initialises "
                    f"kernels N(0, 0.02) and biases 0 (the tutorial's {_TUTORIAL_INIT})"
                )
            notes.append("tutorial key 'weight_init': kernels N(0, 0.02), biases 0, as this kit always does")
        elif key in _NOT_APPLICABLE:
            if key in _TUTORIAL_TYPES and value is not None:
                _coerce(value, _TUTORIAL_TYPES[key], f"{where} key {key!r}")
            notes.append(f"tutorial key {key!r} = {value}: not applicable here ({_NOT_APPLICABLE[key]})")
        else:
            values[key] = value
    filled = sorted(k for k in defaults if k not in values)
    if filled:
        notes.append(
            f"{len(filled)} keys the tutorial's file does not have take this kit's base values ({', '.join(filled)})"
        )
    return {**{k: defaults[k] for k in filled}, **values}, notes


def load_config(name: str, yaml_path: str | Path = DEFAULT_YAML, overrides: dict | None = None) -> Config:
    """Load config ``name`` from ``yaml_path`` and apply ``overrides`` (key -> value). A section in
    the tutorial's format is translated first (:func:`translate_tutorial`).

    Raises:
        ConfigError: missing file or name, unknown key, wrong type or value (message names which).
    """
    path = Path(yaml_path)
    doc = _read_yaml(path)
    if name not in doc:
        names = sorted(map(str, doc))
        hint = did_you_mean(name, names)
        raise ConfigError(f"config {name!r} not found in {path}{hint} (available: {', '.join(names)})")
    section = doc[name]
    if not isinstance(section, dict):
        raise ConfigError(f"{path} [{name}]: expected a mapping of keys, got {type(section).__name__}")
    values, notes = dict(section), []
    if is_tutorial_section(section):
        defaults = dict(_read_yaml(DEFAULT_YAML)["base"])
        values, notes = translate_tutorial(section, f"{path} [{name}]", defaults)
    source = str(path)
    if overrides:
        unknown = sorted(set(overrides) - set(FIELDS))
        if unknown:
            raise ConfigError(f"override: unknown key {unknown[0]!r}{did_you_mean(unknown[0], FIELDS)}")
        for split in ("train", "val"):
            npy_keys = [f"{split}_path_npy_{k}" for k in ("data", "label")]
            stale = [k for k in npy_keys if values.get(k) and k not in overrides]
            if f"{split}_path" in overrides and stale:
                # the file's twins belong to its own path; an overridden path has its twins beside it
                notes.append(
                    f"{split}_path overridden: its .npy twins are looked up beside it, not at {path}'s "
                    f"{' and '.join(stale)} ({values[stale[0]]})"
                )
                values.update(dict.fromkeys(stale))
        values.update(overrides)
        source = f"{path} + overrides {sorted(overrides)}"
    return make_config(values, name, source, tuple(notes))


def replace(cfg: Config, **changes: Any) -> Config:
    """Return a copy of ``cfg`` with ``changes`` applied and checked like a file's keys."""
    values = {k: getattr(cfg, k) for k in FIELDS}
    values.update(changes)
    return make_config(values, cfg.name, cfg.source, cfg.notes)


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
            f"{num_replicas} replicas; set local_batch_size or a multiple of {num_replicas}"
        )
    return cfg.global_batch_size, cfg.global_batch_size // num_replicas


def steps_per_epoch(cfg: Config, num_replicas: int = 1) -> int:
    """Optimizer steps per epoch: ``Nsamples // global_batch_size`` (the last partial batch is dropped).

    Raises:
        ConfigError: ``Nsamples`` is smaller than one global batch.
    """
    global_bs, _ = batch_sizes(cfg, num_replicas)
    if cfg.Nsamples < global_bs:
        raise ConfigError(
            f"config {cfg.name!r}: Nsamples {cfg.Nsamples} is smaller than one global batch ({global_bs})"
        )
    return cfg.Nsamples // global_bs


def val_steps(cfg: Config, num_replicas: int = 1) -> int:
    """Validation steps: ``ceil(Nsamples_val / global_batch_size)``; the last batch is padded and masked."""
    global_bs, _ = batch_sizes(cfg, num_replicas)
    return -(-cfg.Nsamples_val // global_bs)


# --- command line ------------------------------------------------------------------------------


def config_help() -> str:
    """``--config``'s help: the names the kit's YAML file holds."""
    try:
        names = ", ".join(config_names())
    except ConfigError:
        names = "see configs/UNet.yaml"
    return f"config name in the YAML file (default: %(default)s; the kit's: {names})"


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--yaml_config``, ``--config``, the tutorial's flags and ``--set KEY=VALUE`` to ``parser``.

    The tutorial's switches keep its spelling (``--enable_amp``, ``--enable_jit``); ``--no-enable_amp``
    and ``--no-enable_jit`` turn them off where a config turns them on.
    """
    g = parser.add_argument_group("configuration")
    g.add_argument(
        "--yaml_config",
        default=str(DEFAULT_YAML),
        help="YAML file of named configs, this kit's or the tutorial's (default: the kit's)",
    )
    g.add_argument("--config", default="cpu_default", help=config_help())
    g.add_argument("--num_epochs", type=int, help="override num_epochs")
    g.add_argument("--global_batch_size", type=int, help="override global_batch_size")
    g.add_argument("--local_batch_size", type=int, help="per-replica batch; global = local x replicas")
    g.add_argument("--num_data_workers", type=int, help="override num_data_workers")
    g.add_argument("--data_loader_config", choices=LOADERS, help="input pipeline")
    g.add_argument(
        "--enable_amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision (amp_dtype, bfloat16 by default)",
    )
    g.add_argument("--amp_dtype", choices=CHOICES["amp_dtype"], help="half type used when AMP is on")
    g.add_argument(
        "--enable_jit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="XLA compilation of TF's train step (JAX always compiles)",
    )
    g.add_argument(
        "--enable_manual_profiling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-step NVTX ranges and a capture window (cudaProfilerStart/Stop and the framework's "
        "trace) over the first 60 steps of epoch 2, or over profile_steps",
    )
    g.add_argument("--Nsamples", type=int, help="training crops per epoch")
    g.add_argument("--exp_dir", help="root folder of runs (checkpoints, logs), relative to the current folder")
    g.add_argument(
        "--data_dir", help="folder that relative train_path / val_path are relative to (default: the current folder)"
    )
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key; VALUE is YAML (e.g. --set unet_widths=[8,16] --set lambda_rho=0.1)",
    )


#: The config keys that have their own flag.
FLAG_KEYS = (
    "num_epochs",
    "global_batch_size",
    "local_batch_size",
    "num_data_workers",
    "data_loader_config",
    "enable_amp",
    "amp_dtype",
    "enable_jit",
    "enable_manual_profiling",
    "Nsamples",
    "exp_dir",
    "data_dir",
)


def config_from_args(args: argparse.Namespace) -> Config:
    """Load the config named by parsed ``args`` and apply its flag and ``--set`` overrides.

    Raises:
        ConfigError: a flag and a ``--set`` of the same key with different values (neither silently wins).
    """
    if getattr(args, "global_batch_size", None) is not None and getattr(args, "local_batch_size", None) is not None:
        raise ConfigError("--global_batch_size and --local_batch_size conflict: give one (global = local x replicas)")
    overrides = dict(parse_override(s) for s in args.set)
    for key in FLAG_KEYS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in overrides and overrides[key] != value:
            raise ConfigError(
                f"--{key} {value} and --set {key}={overrides[key]} conflict: give one (or the same value twice)"
            )
        overrides[key] = value
    return load_config(args.config, args.yaml_config, overrides)


def config_argv(args: argparse.Namespace) -> list[str]:
    """The config flags of parsed ``args`` (:func:`add_config_args`) as a command line that selects the
    same config in another process: ``--yaml_config``, ``--config``, then every flag given and every
    ``--set``, each as ``--set KEY=VALUE`` (JSON values, so a ``False`` switch is passed on too)."""
    out = ["--yaml_config", args.yaml_config, "--config", args.config]
    for key in FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            out += ["--set", f"{key}={json.dumps(value)}"]
    for text in args.set:
        out += ["--set", text]
    return out
