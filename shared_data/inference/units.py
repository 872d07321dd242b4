"""The units of a stored volume: what its transformed values mean physically, and the reading of it.

Volumes hold stored (transformed) values, channel-first float32 (C, L, L, L) (:func:`read_volume`).
The transforms, the voxel size and the channel names come from the files' attributes
(:mod:`shared_data.data.generate` writes them: ``box_size_mpc_h``, ``density_scale``,
``temperature_scale``, ``igm_T0_K``, ``velocity_scale_km_s``, ``igm_gamma``, ``k_jeans_h_mpc``,
``Hydro_channels``, ``Nbody_channels``; for a file that gives the temperature and velocity scales only
in its ``transforms`` text, that text is read) or from flags (:data:`QUANTITIES`), gathered by
:func:`units_from_files` into one :class:`Units`. A file without one gets a
:class:`~shared_data.core.errors.DatasetError` naming the attribute and the flag that gives it
(``--voxel_size``, ``--density_scale``, ...); a flag always wins over an attribute, and says so in the
log. When both files carry an attribute, they must agree. A file without any of the attributes (the
tutorial's own files, e.g. its Nyx volumes) is read with the transforms of :data:`TUTORIAL_DEFAULTS`,
said in one log line; flags still win.

:func:`linear` and :func:`physical` invert the transforms: the metrics compare in linear physical
space, the figure shows logarithms and km/s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import numpy as np

from shared_data.core.errors import DatasetError
from shared_data.data import dataset

log = logging.getLogger("dlas.validate")  # the lines of the validate report, whichever command reads the units

DENSITY, TEMPERATURE = "gas_density", "gas_temperature"
DM_DENSITY = "dm_density"

#: What the metrics need: (attribute of the file, flag that gives it, what it is).
QUANTITIES = {
    "voxel_size": ("box_size_mpc_h", "--voxel_size", "the voxel size in Mpc/h (attribute: the box side in Mpc/h)"),
    "density_scale": ("density_scale", "--density_scale", "s of the density transform rho = exp(s x)"),
    "temperature_scale": ("temperature_scale", "--temperature_scale", "s of the temperature transform T = T0 exp(s x)"),
    "temperature_T0": ("igm_T0_K", "--T0", "T0 in K of the temperature transform T = T0 exp(s x)"),
    "velocity_scale": ("velocity_scale_km_s", "--velocity_scale", "km/s of the velocity transform v = scale x"),
    "igm_gamma": ("igm_gamma", "--igm_gamma", "gamma of T = T0 (1 + delta)^(gamma - 1), for the temperature baseline"),
    "k_jeans": ("k_jeans_h_mpc", "--k_jeans", "k_J in h/Mpc of the non-ML baseline's Jeans filter"),
    "hydro_channels": ("Hydro_channels", "--hydro_channels", "the names of the Hydro channels"),
    "nbody_channels": ("Nbody_channels", "--nbody_channels", "the names of the Nbody channels"),
}
#: Where the ``transforms`` text states a scale, for files without the numeric attribute.
_TEXT = {
    "temperature_scale": ("temperature", r"x = ln\(T / T0\) / ([-+0-9.eE]+)"),
    "temperature_T0": ("temperature", r"T0 = ([-+0-9.eE]+) K"),
    "velocity_scale": ("velocity", r"x = v / ([-+0-9.eE]+) km/s"),
}
#: Quantities a file may lack: the baselines that need them are then left out.
OPTIONAL = ("igm_gamma", "k_jeans")
#: What a file without any attribute is assumed to hold (the tutorial's own volumes): the tutorial's
#: density transform rho = exp(14 x), and the rest as this kit's generator writes them (0.25 Mpc/h
#: voxels, T = 1e4 K exp(8 x), v = 2000 km/s x, its channel names, gamma = 1.6, k_J = 6 h/Mpc).
TUTORIAL_DEFAULTS = {
    "voxel_size": 0.25,
    "density_scale": 14.0,
    "temperature_scale": 8.0,
    "temperature_T0": 1e4,
    "velocity_scale": 2000.0,
    "igm_gamma": 1.6,
    "k_jeans": 6.0,
    "hydro_channels": ("gas_density", "gas_temperature", "gas_vx", "gas_vy", "gas_vz"),
    "nbody_channels": ("dm_density", "dm_vx", "dm_vy", "dm_vz"),
}


@dataclasses.dataclass(frozen=True)
class Units:
    """How stored values map to physical ones, and where each number came from (``sources``)."""

    voxel_size: float  # Mpc/h (comoving)
    density_scale: float  # rho / rho_mean = exp(density_scale x)
    temperature_scale: float  # T = T0 exp(temperature_scale x)
    temperature_T0: float  # K
    velocity_scale: float  # km/s per stored unit
    igm_gamma: float | None
    k_jeans: float | None  # h/Mpc
    hydro_channels: tuple[str, ...]
    nbody_channels: tuple[str, ...]
    sources: dict


# --- reading ----------------------------------------------------------------------------------------


def read_volume(path: str | Path, key: str) -> tuple[np.ndarray, dict]:
    """Dataset ``key`` of ``path`` (C, L, L, L) float32 and the file's attributes.

    Raises:
        DatasetError: the file or dataset is missing, not 4-D channel-first cubic float32, or not finite.
    """
    path = Path(path)
    with dataset.open_h5(path) as f, dataset.reading(path, key):
        if key not in f or not hasattr(f[key], "shape"):
            raise DatasetError(f"{path}: missing dataset {key!r} (found keys {sorted(f.keys())})")
        ds = f[key]
        if ds.ndim != 4 or len(set(ds.shape[1:])) != 1 or ds.dtype != np.float32:
            raise DatasetError(f"{path}: {key!r} is {ds.dtype} {ds.shape}, expected float32 (C, L, L, L) channel-first")
        data = ds[...]
        attrs = dataset.plain_attrs(f.attrs)
    dataset.check_finite(data, f"{path} {key}")
    return data, attrs


def _attribute(name: str, attrs: dict, path: Path) -> tuple[object, str] | None:
    key = QUANTITIES[name][0]
    if key in attrs:
        value = attrs[key]
        return (dataset.json_attr(attrs, key, path) if name.endswith("channels") else value), f"{path.name}:{key}"
    if name in _TEXT:
        transforms = dataset.json_attr(attrs, "transforms", path)
        kind, pattern = _TEXT[name]
        text = transforms.get(kind) if isinstance(transforms, dict) else None
        match = re.search(pattern, text) if isinstance(text, str) else None
        if match:
            return float(match.group(1)), f"{path.name}:transforms[{kind!r}]"
    return None


def units_from_files(files: dict[Path, dict], side: int, flags: dict, flags_given: bool = True) -> Units:
    """The :class:`Units` of volumes of side ``side``, from the attributes of ``files`` (path -> attrs,
    the truth first) or from ``flags`` (quantity -> value or None). ``flags_given``: whether the
    command has the flags (validate, predict); a missing attribute's message otherwise says to
    write it into the file (the trainer's time-to-quality mode).

    Files without any of the attributes (the tutorial's own) get :data:`TUTORIAL_DEFAULTS`, said
    in one log line.

    Raises:
        DatasetError: a required quantity is in no file and no flag gives it (where a file has some
            of the attributes); two files disagree; a value is not a positive number; the channel
            names lack gas density, temperature or dark-matter density.
    """
    values, sources = {}, {}
    bare = not any(_attribute(name, attrs, p) is not None for p, attrs in files.items() for name in QUANTITIES)
    if bare:
        d = TUTORIAL_DEFAULTS
        log.info(
            "%s has no attributes (the tutorial's layout): assuming rho = exp(%g x), T = %g K exp(%g x), "
            "v = %g km/s x, %g Mpc/h voxels, gamma %g, k_J %g h/Mpc and this kit's channel names (flags override)",
            next(iter(files)),
            *(d[k] for k in ("density_scale", "temperature_T0", "temperature_scale", "velocity_scale")),
            *(d[k] for k in ("voxel_size", "igm_gamma", "k_jeans")),
        )
    for name, (key, flag, what) in QUANTITIES.items():
        found = {p: v for p in files if (v := _attribute(name, files[p], p)) is not None}
        distinct = {json.dumps(v[0]) for v in found.values()}
        if len(distinct) > 1 and flags.get(name) is None:
            detail = ", ".join(f"{p} has {v[0]!r}" for p, v in found.items())
            raise DatasetError(f"attribute {key!r} differs between the files ({detail}); give {flag} to choose")
        if flags.get(name) is not None:
            value, source = flags[name], f"flag {flag}"
            if found:
                log.info("%s %s given by flag (the file says %s)", flag, flags[name], next(iter(found.values()))[0])
        elif found:
            value, source = next(iter(found.values()))
        elif bare:
            value, source = TUTORIAL_DEFAULTS[name], "assumed (the tutorial's layout)"
        elif name in OPTIONAL:
            value, source = None, "absent"
        else:
            files_text = " or ".join(str(p) for p in files)
            remedy = f"give it with {flag}" if flags_given else f"write it into the file as attribute {key!r}"
            raise DatasetError(f"{files_text}: no attribute {key!r} ({what}); {remedy} (no default is assumed)")
        if name == "voxel_size" and found and source != f"flag {flag}":
            value = float(value) / side
        values[name], sources[name] = value, source
    for name in ("voxel_size", "density_scale", "temperature_scale", "temperature_T0", "velocity_scale", *OPTIONAL):
        v = values[name]
        if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise DatasetError(f"{QUANTITIES[name][0]} = {v!r} ({sources[name]}): expected a positive number")
    for name, needed in (("hydro_channels", (DENSITY, TEMPERATURE)), ("nbody_channels", (DM_DENSITY,))):
        names = values[name]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise DatasetError(f"{QUANTITIES[name][0]} = {names!r} ({sources[name]}): expected a list of names")
        for n in needed:
            if n not in names:
                raise DatasetError(
                    f"{QUANTITIES[name][0]} = {list(names)} ({sources[name]}) has no {n!r}; "
                    f"name the channels with {QUANTITIES[name][1]}"
                )
        values[name] = tuple(names)
    return Units(**{k: (float(v) if isinstance(v, int) else v) for k, v in values.items()}, sources=sources)


# --- physical units ---------------------------------------------------------------------------------


def physical(name: str, x: np.ndarray, units: Units) -> np.ndarray:
    """Stored values of channel ``name`` in the figure's physical units (float64): log10(rho / <rho>)
    for densities, log10(T / K) for temperature, km/s for velocities, stored units otherwise."""
    x = np.asarray(x, np.float64)
    if name.endswith("density"):
        return units.density_scale * x / np.log(10)
    if name.endswith("temperature"):
        return np.log10(units.temperature_T0) + units.temperature_scale * x / np.log(10)
    if "_v" in name:
        return units.velocity_scale * x
    return x


def linear(name: str, x: np.ndarray, units: Units) -> np.ndarray:
    """Stored gas density or temperature ``x`` in linear physical units, float64: the density as
    exp(density_scale x) (mean-density units), the temperature as T0 exp(temperature_scale x) in K
    (the inverse of the generator's storage transforms; :func:`physical` gives their logarithms).

    Raises:
        ValueError: ``name`` is neither :data:`DENSITY` nor :data:`TEMPERATURE`.
    """
    x = np.asarray(x, np.float64)
    if name == DENSITY:
        return np.exp(units.density_scale * x)
    if name == TEMPERATURE:
        return units.temperature_T0 * np.exp(units.temperature_scale * x)
    raise ValueError(f"channel {name!r}: expected {DENSITY!r} or {TEMPERATURE!r}")


def unit_label(name: str) -> str:
    """The colour-bar label of :func:`physical`'s units."""
    if name.endswith("density"):
        return "log10 rho/<rho>"
    if name.endswith("temperature"):
        return "log10 T [K]"
    if "_v" in name:
        return "v [km/s]"
    return "stored units"
