"""The NERSC tutorial's own ``config/UNet.yaml`` format, translated key by key into this kit's.

A section is in the tutorial's format when it has a key of its own (``data_size``, ``expdir``,
``weight_init``, ...) or a nested ``lr_schedule`` (:func:`is_tutorial_section`). Every tutorial key
is either mapped to this kit's (``data_size`` -> ``crop_size``, ``lr_schedule.start_lr`` ->
``start_lr``, ...) or reported as not applicable here, one note each (:attr:`Config.notes
<shared_data.core.config_schema.Config.notes>`, logged by the trainers); the keys the tutorial does
not have take this kit's ``base`` values (:func:`translate_tutorial`). The result is a flat mapping
that :func:`shared_data.core.config_checks.make_config` checks like any other section.
"""

from __future__ import annotations

import os
from typing import Any

from shared_data.core.config_checks import coerce
from shared_data.core.config_schema import FIELD_TYPES
from shared_data.core.errors import ConfigError, quoted

#: The tutorial's UNet.yaml keys that are not ours, each mapped to our key(s) or not applicable here.
TUTORIAL_ONLY = ("data_size", "expdir", "weight_init", "box_size", "enable_apex", "enable_benchy", "use_cache")
NOT_APPLICABLE = {
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
TUTORIAL_NAMES = {
    "data_size": "crop_size",
    "expdir": "exp_dir",
    "lr_schedule.scaling": "lr_scaling",
    "lr_schedule.start_lr": "start_lr",
    "lr_schedule.end_lr": "end_lr",
    "lr_schedule.warmup_steps": "warmup_steps",
}
#: The types of the tutorial's keys that have no counterpart here (checked, then reported as not
#: applicable), as :func:`~shared_data.core.config_checks.coerce` reads them.
_TUTORIAL_TYPES = {"enable_apex": bool, "enable_benchy": bool, "box_size": tuple[float, ...]}


def _tutorial_value(key: str, value: Any, where: str) -> Any:
    """``value`` of tutorial key ``key`` (``data_size``, ``lr_schedule.start_lr``, ...) checked against the
    type of this kit's key it maps to, the error naming the tutorial's key."""
    ours = TUTORIAL_NAMES[key]
    return coerce(value, FIELD_TYPES[ours], f"{where} key {key!r} (this kit's {ours})")


def _tutorial_mapping(key: str, value: Any, entries, where: str) -> dict:
    """The tutorial's nested ``key`` (``lr_schedule``, ``weight_init``): a mapping with only ``entries``.

    Raises:
        ConfigError: not a mapping, or an entry that is not one of ``entries``.
    """
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} key {key!r}: expected a mapping of {', '.join(entries)} (the tutorial's form), "
            f"got {quoted(value)}"
        )
    unknown = [k for k in value if k not in entries]
    if unknown:
        raise ConfigError(f"{where} key {key!r}: unknown entry {quoted(unknown[0])} (expected {', '.join(entries)})")
    return value


def translate_tutorial(section: dict, where: str, defaults: dict) -> tuple[dict, list[str]]:
    """Map a tutorial-format section onto this kit's keys; return ``(values, notes)``, one note per
    tutorial key (mapped or not applicable) and one for the keys taken from ``defaults``. An absolute
    ``expdir`` (the tutorial container's ``/logs``) becomes the kit's ``exp_dir`` under the current
    folder, so a run writes nothing outside it. A tutorial key's value is checked against the type of
    the key it maps to (:data:`TUTORIAL_NAMES`, :data:`_TUTORIAL_TYPES`); the error names the tutorial's key.

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
            entries = [k.split(".", 1)[1] for k in TUTORIAL_NAMES if k.startswith("lr_schedule.")]
            schedule = _tutorial_mapping(key, value, entries, where)
            for k, v in schedule.items():
                values[TUTORIAL_NAMES[f"lr_schedule.{k}"]] = _tutorial_value(f"lr_schedule.{k}", v, where)
            values["lr_schedule"] = "cosine"
            notes.append(
                "tutorial key 'lr_schedule' -> lr_schedule = cosine, "
                + ", ".join(f"{TUTORIAL_NAMES['lr_schedule.' + k]} = {v}" for k, v in schedule.items())
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
        elif key in NOT_APPLICABLE:
            if key in _TUTORIAL_TYPES and value is not None:
                coerce(value, _TUTORIAL_TYPES[key], f"{where} key {key!r}")
            notes.append(f"tutorial key {key!r} = {quoted(value)}: not applicable here ({NOT_APPLICABLE[key]})")
        else:
            values[key] = value
    filled = sorted(k for k in defaults if k not in values)
    if filled:
        notes.append(
            f"{len(filled)} keys the tutorial's file does not have take this kit's base values ({', '.join(filled)})"
        )
    return {**{k: defaults[k] for k in filled}, **values}, notes
