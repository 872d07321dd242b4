"""Checking config values and building a :class:`~shared_data.core.config_schema.Config` from them.

:func:`make_config` takes a flat mapping of keys (a YAML section, overrides applied) and checks, in
this order: unknown and missing keys, each value's type (:func:`coerce`: YAML lists become tuples,
integers become floats where a number is expected, ``1e-3`` written as text becomes a number), the
choices of the string keys (:data:`~shared_data.core.config_schema.CHOICES`), the bounds of each
numeric key (:data:`RANGES`, :data:`MAXIMA`) and the rules that tie keys together (crop divisibility,
channel indices, bf16 gradient all-reduce). Each failure raises
:class:`~shared_data.core.errors.ConfigError` naming where the value came from
(``<file> [<section>] key '<key>'``) and what was expected.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from shared_data.core.config_schema import CHOICES, FIELD_TYPES, FIELDS, Config
from shared_data.core.errors import ConfigError, did_you_mean, quoted


def type_name(tp: Any) -> str:
    """How messages name the type hint ``tp``: ``integer``, ``number or null``, ``list of integer``, ..."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{type_name(args[0])} or null"
    if origin is tuple:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    return {int: "integer", float: "number", bool: "boolean", str: "string"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the type hint ``tp`` and convert lists to tuples, ints to floats.

    ``tp`` is a hint of :data:`~shared_data.core.config_schema.FIELD_TYPES`: ``bool``, ``int``,
    ``float``, ``str``, ``X | None`` or ``tuple[X, ...]`` of those. ``where`` starts the message.

    Raises:
        ConfigError: ``value`` is not of type ``tp`` (``"<where>: expected integer, got 2.5"``).
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
        return coerce(value, inner, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected {type_name(tp)}, got {quoted(value)}")
        inner = typing.get_args(tp)[0]
        return tuple(coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is float and isinstance(value, str):
        value = _float_text(value, tp, where)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise ConfigError(f"{where}: expected {type_name(tp)}, got {quoted(value)}")
    return float(value) if tp is float else value


def _float_text(text: str, tp: Any, where: str) -> float:
    """A number written as text that YAML 1.1 leaves a string (``1e-3``, ``2E-4``): parse it."""
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected {type_name(tp)}, got {quoted(text)}") from None


def make_config(values: dict, name: str, source: str, notes: tuple[str, ...] = ()) -> Config:
    """Build a :class:`Config` from a flat mapping, checking keys, types, choices and ranges.

    Raises:
        ConfigError: unknown or missing key, wrong type, value outside its choices or range.
    """
    where = f"{source} [{name}]"
    unknown = sorted(str(k) for k in set(values) - set(FIELDS))  # a YAML key may be a number or null
    if unknown:
        hint = did_you_mean(unknown[0], FIELDS) or f" (known keys: {', '.join(sorted(FIELDS))})"
        raise ConfigError(f"{where}: unknown key {quoted(unknown[0])}{hint}")
    missing = [k for k in FIELDS if k not in values]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r} ({type_name(FIELD_TYPES[missing[0]])})")
    kwargs = {k: coerce(values[k], FIELD_TYPES[k], f"{where} key {k!r}") for k in FIELDS}
    for key, choices in CHOICES.items():
        if kwargs[key] not in choices:
            raise ConfigError(f"{where} key {key!r}: expected one of {', '.join(choices)}, got {quoted(kwargs[key])}")
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
#: The most optimizer steps one run may take: one learning-rate entry each, built at start
#: (:func:`shared_data.model.schedule.lr_table` checks it, once the replicas fix the global batch).
MAX_TOTAL_STEPS = 10**6


def _check_ranges(cfg: Config, where: str) -> None:
    """The bounds of :data:`RANGES` and :data:`MAXIMA`, then the rules that tie keys together."""
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
                    f"got {quoted(value if not isinstance(value, tuple) else list(value))}"
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
