"""The run configuration: one frozen, typed object loaded from YAML, shared by TF, JAX and the tools.

Configs live in ``configs/UNet.yaml`` (shipped inside the installed package; ``--yaml_config`` takes
any other file) as named sections that inherit with YAML merge keys, as in the NERSC tutorial
(``short: {<<: *base, num_epochs: 4}``). The file is flat: every key is a field of :class:`Config`,
so an overlay holds only its differences. Loading checks every key, type and range and raises
:class:`~shared_data.core.errors.ConfigError` naming the file, section, key and expected value.

This module owns reading the file (:func:`load_config`, :func:`config_names`), copies with changes
(:func:`replace`), the plain form written to logs and checkpoints (:func:`config_dict`) and the
derived numbers (global/local batch size, steps per epoch), which are computed here, never written
back into the config. The rest of the configuration is one module per concern:

- :mod:`shared_data.core.config_schema`: the dataclass :class:`Config` and the choices of its keys;
- :mod:`shared_data.core.config_checks`: types, choices, ranges; :func:`make_config`;
- :mod:`shared_data.core.tutorial_yaml`: the tutorial's own ``config/UNet.yaml``, which loads
  unchanged, translated key by key;
- :mod:`shared_data.core.config_cli`: the command-line flags (the tutorial's ``--num_epochs 2``,
  ``--enable_amp``, ... and ``--set KEY=VALUE``), applied after the section is loaded.

Relative paths resolve against the current folder; ``data_dir`` (``--data_dir``), when set, is the
folder the data paths are relative to instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared_data.core.config_checks import make_config
from shared_data.core.config_schema import FIELDS, Config
from shared_data.core.errors import ConfigError, did_you_mean, quoted
from shared_data.core.tutorial_yaml import is_tutorial_section, translate_tutorial

# Config lives in config_schema; it is exported here too because most of the kit imports it beside
# load_config and replace.
__all__ = [
    "DEFAULT_YAML",
    "REPO_ROOT",
    "Config",
    "batch_sizes",
    "config_dict",
    "config_names",
    "load_config",
    "replace",
    "steps_per_epoch",
    "val_steps",
]

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_ROOT.parent


def _shipped_yaml() -> Path:
    """``configs/UNet.yaml`` of the checkout, or its installed copy ``shared_data/configs/UNet.yaml``
    (the wheel maps the top-level folder there, a name that cannot collide with a user's ``configs``)."""
    installed = PACKAGE_ROOT / "configs" / "UNet.yaml"
    return installed if installed.is_file() else REPO_ROOT / "configs" / "UNet.yaml"


DEFAULT_YAML = _shipped_yaml()


#: What a YAML value nested beyond what the reader follows (Python's recursion limit) is told.
TOO_DEEP = (
    "a value nested deeper than the YAML reader follows (lists or mappings inside each other); expected plain values"
)


def _read_yaml(path: Path) -> dict:
    """The top-level mapping of the YAML file ``path`` (config name -> section).

    Raises:
        ConfigError: the file is missing, unreadable, not text, not YAML, nested too deep or not a
            mapping.
    """
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {' '.join(str(err).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text file, expected YAML") from None
    except RecursionError:
        raise ConfigError(f"config file {path}: {TOO_DEEP}") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read ({err.strerror})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping of config names, got {type(doc).__name__}")
    return doc


def config_names(yaml_path: str | Path = DEFAULT_YAML) -> list[str]:
    """Names of the configs defined in ``yaml_path``, sorted.

    Raises:
        ConfigError: the file is missing, unreadable or not a YAML mapping.
    """
    return sorted(_read_yaml(Path(yaml_path)))


def load_config(name: str, yaml_path: str | Path = DEFAULT_YAML, overrides: dict | None = None) -> Config:
    """Load config ``name`` from ``yaml_path`` and apply ``overrides`` (key -> value). A section in
    the tutorial's format is translated first
    (:func:`~shared_data.core.tutorial_yaml.translate_tutorial`).

    Raises:
        ConfigError: missing file or name, unknown key, wrong type or value (message names which).
    """
    path = Path(yaml_path)
    doc = _read_yaml(path)
    if name not in doc:
        names = sorted(map(str, doc))
        hint = did_you_mean(name, names)
        raise ConfigError(f"config {quoted(name)} not found in {path}{hint} (available: {', '.join(names)})")
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
            raise ConfigError(f"override: unknown key {quoted(unknown[0])}{did_you_mean(unknown[0], FIELDS)}")
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
    """Return a copy of ``cfg`` with ``changes`` (key -> value) applied and checked like a file's keys.

    Raises:
        ConfigError: an unknown key, or a value of the wrong type or outside its choices or range.
    """
    values = {k: getattr(cfg, k) for k in FIELDS}
    values.update(changes)
    return make_config(values, cfg.name, cfg.source, cfg.notes)


def config_dict(cfg: Config) -> dict:
    """The YAML keys of ``cfg`` as plain Python values (lists, not tuples), in :class:`Config`'s field
    order, for logs and checkpoints."""

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
    """Validation steps: ``ceil(Nsamples_val / global_batch_size)``; the last batch is padded and masked.

    Raises:
        ConfigError: the global batch does not divide over the replicas (:func:`batch_sizes`).
    """
    global_bs, _ = batch_sizes(cfg, num_replicas)
    return -(-cfg.Nsamples_val // global_bs)
