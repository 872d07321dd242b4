"""The configuration's command line, shared by every command that loads a config: ``--yaml_config``,
``--config``, the tutorial's flags (``--num_epochs 2``, ``--enable_amp``, ...) and a generic
``--set KEY=VALUE`` whose value is parsed as YAML and type-checked like the file's. Flags and
``--set`` are overrides applied after the section is loaded (:func:`config_from_args`);
:func:`config_argv` writes the same choice back as a command line for another process.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from shared_data.core import tutorial_yaml
from shared_data.core.config import DEFAULT_YAML, TOO_DEEP, config_names, load_config
from shared_data.core.config_schema import CHOICES, FIELDS, Config
from shared_data.core.errors import ConfigError, did_you_mean, quoted
from shared_data.core.loader_kinds import NAMES as LOADERS


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


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``KEY=VALUE`` and parse VALUE as YAML (``8`` -> int, ``[4,8]`` -> list, ``null`` -> None).

    Raises:
        ConfigError: no ``=``, or an unknown key.
    """
    if "=" not in text:
        raise ConfigError(f"override {quoted(text)}: expected KEY=VALUE")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in FIELDS:
        raise ConfigError(f"override {quoted(text)}: {_unknown_key(key, raw)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise ConfigError(f"override {quoted(text)}: {TOO_DEEP}") from None
    return key, value


def _unknown_key(key: str, raw: str) -> str:
    """What a ``--set`` of ``key`` (to ``raw``), not a key of this kit, is told: a tutorial key (a section of the
    tutorial's YAML takes it) names this kit's key or why it does not apply; else the closest key."""
    if key in tutorial_yaml.TUTORIAL_NAMES:
        ours = tutorial_yaml.TUTORIAL_NAMES[key]
        return (
            f"{key!r} is the tutorial's name of this kit's {ours!r}, which a tutorial-format YAML section "
            f"translates; --set takes this kit's keys: --set {ours}={quoted(raw, 40).strip(chr(39))}"
        )
    if key in tutorial_yaml.NOT_APPLICABLE:
        return f"{key!r} is a key of the tutorial's YAML that does not apply here ({tutorial_yaml.NOT_APPLICABLE[key]})"
    if key in tutorial_yaml.TUTORIAL_ONLY:
        return (
            f"{key!r} is a key of the tutorial's YAML, which a tutorial-format YAML section (--yaml_config) translates"
        )
    return f"unknown key {quoted(key)}{did_you_mean(key, FIELDS)}"


def config_from_args(args: argparse.Namespace) -> Config:
    """Load the config named by parsed ``args`` and apply its flag and ``--set`` overrides.

    Raises:
        ConfigError: a flag and a ``--set`` of the same key with different values (neither silently wins),
            ``--global_batch_size`` with ``--local_batch_size``, a malformed ``--set``
            (:func:`parse_override`), or a config that :func:`~shared_data.core.config.load_config` refuses.
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
