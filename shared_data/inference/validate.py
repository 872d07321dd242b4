"""Validate a predicted volume against its truth: the numbers a cosmologist reads, as JSON and a figure.

    python -m shared_data.inference.validate --pred pred.h5 --truth data/val_128.h5 --out DIR
    python -m jax_impl.predict ... --input data/val_128.h5 --out pred.h5 --validate DIR   # weights + a volume

Inputs: ``--pred`` holds ``Hydro`` (N_out, L, L, L) float32 (what ``predict`` writes); ``--truth`` is a
file of the dataset contract with ``Nbody`` and ``Hydro`` of the same side. Values are stored
(transformed) units; the transforms, the voxel size and the channel names come from the files'
attributes (:mod:`shared_data.data.generate` writes them: ``box_size_mpc_h``, ``density_scale``,
``temperature_scale``, ``igm_T0_K``, ``velocity_scale_km_s``, ``igm_gamma``, ``Hydro_channels``,
``Nbody_channels``; for a file that gives the temperature and velocity scales only in its
``transforms`` text, that text is read). A file without one gets a :class:`~shared_data.core.errors.DatasetError`
naming the attribute and the flag that gives it (``--voxel_size``, ``--density_scale``, ...); a flag
always wins over an attribute, and says so in the log. When both files carry an attribute, they must agree.

Metrics (``DIR/validation.json``):

* per-channel L1 (mean |pred - true|) in stored units, for the model and the baseline;
* for gas density rho = exp(density_scale x) and temperature T = T0 exp(temperature_scale x), in
  physical space, of the overdensities delta = f / <f> - 1 in a periodic box of side L x voxel:
  P_true(k), P_pred(k), the ratio P_pred / P_true and the cross-correlation coefficient
  r(k) = P_xy / sqrt(P_xx P_yy) (the usual emulator metrics, e.g. He et al. 2019, PNAS 116, 13825;
  the estimator is :func:`shared_data.data.linear_field.measure_cross_power`), per k bin of width k_f = 2 pi /
  box centred on n k_f, n = 1 .. L/2, the last bin ending at the Nyquist wavenumber pi / voxel;
  summaries: the mode-weighted means of r and of the ratio, and the first k where r < 0.9;
* one-point PDFs of log10(rho / <rho>) and log10(T / K) on common bins, and their L1 distance to
  the truth's PDF (0 equal, 2 disjoint);
* the same metrics for two baselines, under the tags ``baseline`` and ``non_ml``:
  ``baseline``, the dark matter as the gas: the dark-matter channels used as the gas ones (density
  ``dm_density`` as ``gas_density``, velocities ``dm_v*`` as ``gas_v*``), and for temperature the IGM
  relation T = T0 (1 + delta_dm)^(gamma - 1) (Hui & Gnedin 1997) when ``igm_gamma`` is known;
  ``non_ml``, the approximation a cosmologist uses without a network: the dark matter's density and
  velocity smoothed by the Jeans filter 1 / (1 + k^2 / k_J^2) and the mean temperature-density
  relation T = T0 (rho_gas / <rho>)^(gamma - 1) (Hui & Gnedin 1997; the generator's ``--gas filtered``
  applied to the input), when ``k_jeans_h_mpc`` and ``igm_gamma`` are known. A baseline that cannot
  be formed is absent from the JSON (its L1 is null).
* a file without any of the attributes (the tutorial's own files, e.g. its Nyx volumes) is read with
  the transforms of :data:`TUTORIAL_DEFAULTS`, said in one log line; flags still win.

Figure (``DIR/validation.png``): a slice of every channel, true / predicted / residual, in physical
units with colour bars; P ratio, r(k), the two PDFs and the per-channel L1; across the bottom, on one
linear axis against k, the model's P ratio and the r(k) of the model and both baselines with a
shaded 1 +- 2% band;
the framework, weights and precision (the prediction's ``prediction_*`` attributes) in the title. Both
files are written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core.commands import make_parser
from shared_data.core.errors import DatasetError, UserError, run_cli
from shared_data.core.files import atomic_path, check_not_input, one_set_or_none, write_atomic, writing
from shared_data.data import dataset, gas_physics, linear_field

log = logging.getLogger("dlas.validate")

STEM = "validation"  # DIR/validation.json, DIR/validation.png
DENSITY, TEMPERATURE = "gas_density", "gas_temperature"
DM_DENSITY = "dm_density"
PDF_BINS = 60
R_THRESHOLD = 0.9

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
#: The floor of the density transform x = ln(max(rho, floor)) / s, for the non-ML baseline's stored values.
RHO_FLOOR = 1e-3


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


# --- physics -----------------------------------------------------------------------------------------


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


def overdensity(f: np.ndarray) -> np.ndarray:
    """delta = f / <f> - 1 (float64)."""
    f = np.asarray(f, np.float64)
    return f / f.mean() - 1.0


def k_edges(side: int, voxel_size: float) -> np.ndarray:
    """Bin edges in h/Mpc: width k_f = 2 pi / (side voxel_size) centred on n k_f (n = 1 .. side/2),
    the last bin ending at the Nyquist wavenumber pi / voxel_size, 1e-9 relative above it so that the
    modes at |k| = k_Nyquist count (bins are right-open). No mode lies on an inner edge: |k|^2 / k_f^2
    is an integer, (n + 1/2)^2 is not."""
    k_f = 2 * np.pi / (side * voxel_size)
    return k_f * np.append(np.arange(0.5, side / 2, 1.0), side / 2 * (1 + 1e-9))


def spectra(truth: np.ndarray, fields: dict[str, np.ndarray | None], box: float, edges: np.ndarray) -> dict:
    """Power spectra of the overdensities of ``truth`` and of each of ``fields`` (tag -> field, None
    skipped; e.g. ``pred``, ``baseline``, ``non_ml``), their ratio to the truth's (``ratio_<tag>``) and
    their cross-correlation coefficient r(k) = P_xy / sqrt(P_xx P_yy) with the truth (``r_<tag>``)."""
    dt = overdensity(truth)
    k, p_true, n = linear_field.measure_power(dt, box, edges)
    out = {"k": k, "n_modes": n, "P_true": p_true}
    for tag, field in fields.items():
        if field is None:
            continue
        field = overdensity(field)
        _, p, _ = linear_field.measure_power(field, box, edges)
        _, p_x, _ = linear_field.measure_cross_power(field, dt, box, edges)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"P_{tag}"] = p
            out[f"ratio_{tag}"] = p / p_true
            out[f"r_{tag}"] = p_x / np.sqrt(p * p_true)
    return out


def spectrum_summary(s: dict, tag: str) -> dict:
    """Mode-weighted means of ``r`` and of the ratio over the bins, and the first k where r < 0.9."""
    r, ratio, n, k = s[f"r_{tag}"], s[f"ratio_{tag}"], s["n_modes"], s["k"]
    ok = np.isfinite(r) & np.isfinite(ratio) & (n > 0)
    below = np.nonzero(ok & (r < R_THRESHOLD))[0]
    return {
        "r_mean": float(np.average(r[ok], weights=n[ok])) if ok.any() else None,
        "ratio_mean": float(np.average(ratio[ok], weights=n[ok])) if ok.any() else None,
        "k_r_below_0.9": float(k[below[0]]) if len(below) else None,
    }


def pdfs(fields: dict[str, np.ndarray], bins: int = PDF_BINS) -> dict:
    """Normalised histograms of ``fields`` (name -> values; ``true`` first) on common bins spanning
    all their values, and each one's L1 distance to the ``true`` PDF (sum |p - p_true| bin width)."""
    lo = min(float(v.min()) for v in fields.values())
    hi = max(float(v.max()) for v in fields.values())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    out = {"edges": edges}
    for name, v in fields.items():
        out[name], _ = np.histogram(v, edges, density=True)
    width = np.diff(edges)
    out["l1_distance"] = {n: float(np.sum(np.abs(out[n] - out["true"]) * width)) for n in fields if n != "true"}
    return out


def baseline_channel(name: str, nbody: np.ndarray, units: Units) -> tuple[np.ndarray | None, str | None]:
    """The trivial baseline for Hydro channel ``name`` in stored units and its description:
    ``dm_*`` for ``gas_*`` (the dark matter as the gas), temperature from the IGM relation
    T = T0 (rho_dm / <rho>)^(gamma - 1), i.e. x_T = (gamma - 1) s_rho x_dm / s_T; None without one."""
    idx = {n: i for i, n in enumerate(units.nbody_channels)}
    if name == TEMPERATURE:
        if units.igm_gamma is None:
            return None, None
        x_dm = nbody[idx[DM_DENSITY]]
        scale = (units.igm_gamma - 1) * units.density_scale / units.temperature_scale
        return scale * x_dm, f"T0 (rho_dm/<rho>)^(gamma-1), gamma = {units.igm_gamma:g} (IGM relation)"
    twin = "dm_" + name[4:] if name.startswith("gas_") else None
    if twin in idx:
        return nbody[idx[twin]], f"{twin} used as {name}"
    return None, None


def non_ml_channels(nbody: np.ndarray, units: Units) -> dict[str, tuple[np.ndarray, str]]:
    """The non-ML baseline (module docstring) in stored units for the Hydro channels it gives
    (name -> (L, L, L) float64 values, description): the Jeans-filtered dark-matter density and
    velocities and the mean temperature-density relation of the filtered density; {} without
    ``k_jeans`` or ``igm_gamma``."""
    if units.k_jeans is None or units.igm_gamma is None:
        return {}
    idx = {n: i for i, n in enumerate(units.nbody_channels)}
    box = nbody.shape[1] * units.voxel_size
    rho = gas_physics.jeans_filter(
        np.exp(units.density_scale * nbody[idx[DM_DENSITY]].astype(np.float64)), box, units.k_jeans
    )
    rho = np.maximum(rho, 0.0)
    what = f"Jeans-filtered dark matter, k_J = {units.k_jeans:g} h/Mpc"
    out = {DENSITY: (np.log(np.maximum(rho, RHO_FLOOR)) / units.density_scale, what)}
    x_t = (units.igm_gamma - 1) * np.log(np.maximum(rho, 1e-12)) / units.temperature_scale
    out[TEMPERATURE] = (
        x_t,
        f"T0 (rho_filtered/<rho>)^(gamma-1), gamma = {units.igm_gamma:g}, k_J = {units.k_jeans:g} h/Mpc",
    )
    for name in units.hydro_channels:
        twin = "dm_" + name[4:] if name.startswith("gas_") else None
        if name not in out and twin in idx and "_v" in name:
            out[name] = (gas_physics.jeans_filter(nbody[idx[twin]].astype(np.float64), box, units.k_jeans), what)
    return out


def compute_metrics(pred: np.ndarray, truth: np.ndarray, nbody: np.ndarray, units: Units) -> dict:
    """All metrics of the module docstring for channel-first stored volumes ``pred``, ``truth``
    (N_out, L, L, L) and ``nbody`` (N_in, L, L, L); arrays as NumPy (see :func:`to_json`)."""
    side = truth.shape[1]
    box = side * units.voxel_size
    edges = k_edges(side, units.voxel_size)
    names = units.hydro_channels
    l1 = {}
    baselines = {}
    non_ml = non_ml_channels(nbody, units)
    l1_of = lambda x, c: None if x is None else float(np.mean(np.abs(x.astype(np.float64) - truth[c])))
    for c, name in enumerate(names):
        base, what = baseline_channel(name, nbody, units)
        filtered, filtered_is = non_ml.get(name, (None, None))
        baselines[name] = (base, what, filtered, filtered_is)
        l1[name] = {
            "model": l1_of(pred[c], c),
            "baseline": l1_of(base, c),
            "baseline_is": what,
            "non_ml": l1_of(filtered, c),
            "non_ml_is": filtered_is,
        }
    power, pdf = {}, {}
    for name in (DENSITY, TEMPERATURE):
        c = names.index(name)
        base, what, filtered, filtered_is = baselines[name]
        t = linear(name, truth[c], units)
        others = {"pred": pred[c], "baseline": base, "non_ml": filtered}
        others = {tag: linear(name, x, units) for tag, x in others.items() if x is not None}
        s = spectra(t, others, box, edges)
        s["summary"] = {"model": spectrum_summary(s, "pred")}
        for tag in ("baseline", "non_ml"):
            if tag in others:
                s["summary"][tag] = spectrum_summary(s, tag)
        s["baseline_is"], s["non_ml_is"] = what, filtered_is
        power[name] = s
        norm = (lambda f: np.log10(f / f.mean())) if name == DENSITY else np.log10
        fields = {"true": norm(t)} | {tag: norm(x) for tag, x in others.items()}
        pdf[name] = {"variable": "log10(rho/<rho>)" if name == DENSITY else "log10(T/K)", **pdfs(fields)}
    return {
        "side": side,
        "voxel_size_mpc_h": units.voxel_size,
        "box_mpc_h": box,
        "k_fundamental_h_mpc": 2 * np.pi / box,
        "k_nyquist_h_mpc": np.pi / units.voxel_size,
        "k_edges_h_mpc": edges,
        "units_sources": units.sources,
        "l1": l1,
        "l1_mean": {"model": float(np.mean([v["model"] for v in l1.values()]))},
        "power": power,
        "pdf": pdf,
    }


def to_json(value):
    """``value`` with NumPy arrays and scalars as lists and floats, NaN and inf as None."""
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_json(value.tolist())
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


# --- the figure ----------------------------------------------------------------------------------


def short_path(path: str) -> str:
    """An absolute ``path`` as a title shows it: relative to the current folder when inside it, else
    ``.../`` and its last three parts (a title names the run, not the machine's folders)."""
    p = Path(path)
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else ".../" + "/".join(p.parts[-3:])


def provenance(attrs: dict) -> str:
    """The prediction's framework, weights and precision (``prediction_*`` attributes) in a phrase."""
    if "prediction_framework" not in attrs:
        return "prediction (no prediction_* attributes: framework and weights unknown)"
    fw = {"jax": "JAX", "tf": "TensorFlow"}.get(attrs["prediction_framework"], attrs["prediction_framework"])
    weights = re.sub(r"/\S+", lambda m: short_path(m.group()), str(attrs.get("prediction_weights", "weights unknown")))
    config, precision = attrs.get("prediction_config", "?"), attrs.get("prediction_precision", "?")
    return f"{fw} prediction, {weights}, config {config}, {precision}"


def figure(path: Path, pred: np.ndarray, truth: np.ndarray, metrics: dict, units: Units, title: str, z: int) -> None:
    """Write the validation figure (PNG, atomically): rows true / predicted / residual of the slice
    ``z`` (third axis) of every channel in physical units with colour bars, then P ratio, r(k),
    the density and temperature PDFs and the per-channel L1, and last, across the figure, a linear
    panel around 1 (:func:`near_one_panel`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = units.hydro_channels
    n = max(len(names), 5)
    fig, axes = plt.subplots(5, n, figsize=(3.4 * n, 15.5), squeeze=False)
    extent = (0, truth.shape[1] * units.voxel_size) * 2
    for c, name in enumerate(names):
        t, p = physical(name, truth[c, :, :, z], units), physical(name, pred[c, :, :, z], units)
        lo, hi = np.percentile(t, [1, 99])
        res = p - t
        lim = float(np.percentile(np.abs(res), 99)) or 1e-12
        for row, (img, kw, label) in enumerate(
            (
                (t, dict(vmin=lo, vmax=hi, cmap="viridis"), f"true {name}"),
                (p, dict(vmin=lo, vmax=hi, cmap="viridis"), "predicted"),
                (res, dict(vmin=-lim, vmax=lim, cmap="RdBu_r"), "predicted - true"),
            )
        ):
            ax = axes[row, c]
            im = ax.imshow(img.T, origin="lower", extent=extent, **kw)
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("x [Mpc/h]", fontsize=7)
            ax.set_ylabel("y [Mpc/h]", fontsize=7)
            ax.tick_params(labelsize=6)
            bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
            bar.set_label(("Δ " if row == 2 else "") + unit_label(name), fontsize=7)
            bar.ax.tick_params(labelsize=6)
    for c in range(len(names), n):
        for row in range(3):
            axes[row, c].axis("off")
    styles = {DENSITY: "C0", TEMPERATURE: "C3"}
    ax_ratio, ax_r, ax_pdf_rho, ax_pdf_t, ax_l1 = axes[3, :5]
    for name, s in metrics["power"].items():
        k = np.asarray(s["k"], float)
        ax_ratio.semilogx(k, s["ratio_pred"], "-o", ms=3, color=styles[name], label=f"{name} model")
        ax_r.semilogx(k, s["r_pred"], "-o", ms=3, color=styles[name], label=f"{name} model")
        for tag, label, line in (("baseline", "baseline (DM as gas)", "--"), ("non_ml", "non-ML (filtered DM)", ":")):
            if f"ratio_{tag}" in s:
                ax_ratio.semilogx(k, s[f"ratio_{tag}"], line, color=styles[name], label=f"{name} {label}")
                ax_r.semilogx(k, s[f"r_{tag}"], line, color=styles[name], label=f"{name} {label}")
    ax_ratio.axhline(1, color="k", lw=0.8)
    ax_ratio.set_ylabel("P_pred / P_true (log)")
    # a ratio is read as a factor: on a log axis a model at 0.9 and a baseline at 30 both stay
    # readable (a linear one flattens the model onto zero); the near-1 panel gives the percents
    ax_ratio.set_yscale("log")
    ax_ratio.set_title("power spectrum ratio", fontsize=9)
    ax_r.set_title("cross-correlation", fontsize=9)
    ax_r.axhline(1, color="k", lw=0.8)
    ax_r.set_ylabel("r(k) = P_xy / sqrt(P_xx P_yy)")
    for ax in (ax_ratio, ax_r):
        ax.set_xlabel("k [h/Mpc]")
        ax.axvline(metrics["k_nyquist_h_mpc"], color="gray", lw=0.6, ls=":")
        ax.legend(fontsize=6)
    for ax, name in ((ax_pdf_rho, DENSITY), (ax_pdf_t, TEMPERATURE)):
        d = metrics["pdf"][name]
        centres = 0.5 * (np.asarray(d["edges"][1:]) + np.asarray(d["edges"][:-1]))
        for tag, style in (("true", "k-"), ("pred", "C1-"), ("baseline", "C2--"), ("non_ml", "C4:")):
            if tag in d:
                values = np.asarray(d[tag], float)
                ax.semilogy(centres, np.where(values > 0, values, np.nan), style, label=tag)  # empty bins: gaps
        ax.set_xlabel(d["variable"])
        ax.set_ylabel("PDF")
        ax.set_title(f"{name} one-point PDF", fontsize=9)
        ax.legend(fontsize=6)
    x = np.arange(len(names))
    l1 = metrics["l1"]
    ax_l1.bar(x - 0.27, [l1[m]["model"] for m in names], 0.27, label="model")
    ax_l1.bar(x, [l1[m]["baseline"] or 0.0 for m in names], 0.27, label="DM as gas")
    ax_l1.bar(x + 0.27, [l1[m].get("non_ml") or 0.0 for m in names], 0.27, label="non-ML")
    ax_l1.set_xticks(x, [m.replace("gas_", "") for m in names], fontsize=7, rotation=90)
    ax_l1.set_title("L1 per channel", fontsize=9)
    ax_l1.set_ylabel("L1 (stored units)")
    ax_l1.legend(fontsize=6)
    for ax in axes[3, 5:]:
        ax.axis("off")
    grid = axes[4, 0].get_gridspec()
    for ax in axes[4]:
        ax.remove()
    near_one_panel(fig.add_subplot(grid[4, :]), metrics, styles)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


#: Half-width of the shaded band around 1 in the linear panel of :func:`near_one_panel`.
BAND = 0.02
#: Lowest value the linear panel shows; lower values leave the axis, and the panel says so.
NEAR_ONE_FLOOR = 0.8


def near_one_panel(ax, metrics: dict, styles: dict[str, str]) -> None:
    """Draw, on one linear axis against linear k (h/Mpc) up to Nyquist, P_pred / P_true and r(k) of
    the model and r(k) of both baselines for gas density and temperature (``metrics["power"]``), with a
    shaded band 1 +- :data:`BAND` and a dotted line at k_Nyquist / 2: a deficit of a few percent at
    small scales is seen at once. The y range spans the lowest plotted value (at least
    :data:`NEAR_ONE_FLOOR`, at most 0.96) to above 1 + BAND; values below it are named in a note.
    Line labels: ``"<name> P ratio model"``, ``"<name> r model"``, ``"<name> r baseline"`` (the dark
    matter as gas), ``"<name> r non-ML"``."""
    ax.axhspan(1 - BAND, 1 + BAND, color="0.85", zorder=0, label=f"1 ± {BAND:.0%}")
    ax.axhline(1, color="k", lw=0.8)
    lowest = []
    for name, s in metrics["power"].items():
        k = np.asarray(s["k"], float)
        series = [("P ratio model", s["ratio_pred"], "-o"), ("r model", s["r_pred"], "-s")]
        if "r_baseline" in s:
            series.append(("r baseline", s["r_baseline"], "--"))
        if "r_non_ml" in s:
            series.append(("r non-ML", s["r_non_ml"], ":"))
        for what, values, style in series:
            y = np.asarray([np.nan if v is None else v for v in values], float)
            ax.plot(
                k,
                y,
                style,
                ms=3,
                lw=1.2,
                color=styles[name],
                label=f"{name} {what}",
                mfc="none" if what.startswith("r ") else styles[name],
            )
            lowest.append((float(np.nanmin(y)) if np.isfinite(y).any() else 1.0, f"{name} {what}"))
    k_nyq = metrics["k_nyquist_h_mpc"]
    ax.axvline(k_nyq / 2, color="gray", lw=0.8, ls=":", label="k_Nyquist / 2")
    low = min((v for v, _ in lowest), default=1.0)
    bottom = min(0.96, max(NEAR_ONE_FLOOR, low - 0.01))
    ax.set_ylim(bottom, 1 + max(2 * BAND, (1 - bottom) / 3))
    ax.set_xlim(0, k_nyq * 1.02)
    off = [what for v, what in lowest if v < bottom]
    if off:
        ax.annotate("below the axis: " + ", ".join(off), (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=7)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P_pred / P_true and r(k), linear")
    ax.set_title(f"near 1: power ratio and cross-correlation, band ± {BAND:.0%}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.005, 0.5))  # outside: the data stay clear


# --- driver ------------------------------------------------------------------------------------------


def check_prediction_input(pred_path: Path, pred_attrs: dict, truth_path: Path, truth_attrs: dict) -> None:
    """Refuse to score a prediction against a volume other than the one it was predicted from: the
    Nbody checksums it records (``prediction_input_Nbody_crc32``) must be the truth file's.

    Raises:
        DatasetError: both checksums are known and differ (the message names the recorded input).
    """
    made_from = pred_attrs.get("prediction_input_Nbody_crc32")
    truth_crc = truth_attrs.get("Nbody_crc32")
    if made_from is None or truth_crc is None:
        return
    if dataset.json_attr(pred_attrs, "prediction_input_Nbody_crc32", pred_path) != dataset.json_attr(
        truth_attrs, "Nbody_crc32", truth_path
    ):
        raise DatasetError(
            f"{pred_path} was predicted from {pred_attrs.get('prediction_input', 'another volume')}, whose Nbody "
            f"checksums differ from {truth_path}'s; validate it against the volume it was predicted from"
        )


def report_files(out_dir: str | Path, stem: str = STEM, plot: bool = True) -> list[Path]:
    """The files :func:`validate_files` writes in ``out_dir``: ``<stem>.json`` and, with ``plot``, ``<stem>.png``."""
    return [Path(out_dir) / f"{stem}.{ext}" for ext in ("json", "png")[: 1 + plot]]


def validate_files(
    pred_path,
    truth_path,
    out_dir,
    flags: dict | None = None,
    z: int | None = None,
    stem: str = STEM,
    plot: bool = True,
) -> dict:
    """Compute the metrics of ``pred_path`` against ``truth_path``, write ``<stem>.json`` and (if
    ``plot``) ``<stem>.png`` into ``out_dir`` (created) and return the metrics (JSON form); ``flags``
    give quantities of :data:`QUANTITIES` (None: from the attributes), ``z`` the slice shown.

    Raises:
        DatasetError: the prediction was made from another volume, a file breaks its layout, the
            sides or channel counts differ, a needed
            attribute is missing (the message names the flag) or two files disagree on it.
        UserError: a report file is the prediction or the truth file (:func:`report_files`).
    """
    pred_path, truth_path, out_dir = Path(pred_path), Path(truth_path), Path(out_dir)
    outputs = {f"--out's {p.name}": p for p in report_files(out_dir, stem, plot)}
    check_not_input(outputs, {"--pred": pred_path, "--truth": truth_path}, "report")
    pred, pred_attrs = read_volume(pred_path, "Hydro")
    truth, truth_attrs = read_volume(truth_path, "Hydro")
    nbody, _ = read_volume(truth_path, "Nbody")
    if pred.shape != truth.shape:
        raise DatasetError(f"{pred_path}: Hydro {pred.shape} differs from the truth's {truth.shape} in {truth_path}")
    if nbody.shape[1:] != truth.shape[1:]:
        raise DatasetError(f"{truth_path}: Nbody {nbody.shape} and Hydro {truth.shape} differ in side")
    check_prediction_input(pred_path, pred_attrs, truth_path, truth_attrs)
    side = truth.shape[1]
    units = units_from_files({truth_path: truth_attrs, pred_path: pred_attrs}, side, flags or {})
    if len(units.hydro_channels) != truth.shape[0] or len(units.nbody_channels) != nbody.shape[0]:
        raise DatasetError(
            f"channel names {list(units.hydro_channels)} / {list(units.nbody_channels)} do not match Hydro "
            f"{truth.shape[0]} / Nbody {nbody.shape[0]} channels of {truth_path}"
        )
    z = side // 2 if z is None else z
    if not 0 <= z < side:
        raise UserError(f"--slice {z}: expected an index in [0, {side})")
    metrics = compute_metrics(pred, truth, nbody, units)
    what = provenance(pred_attrs)
    metrics = {"prediction": str(pred_path.absolute()), "truth": str(truth_path.absolute()), "what": what, **metrics}
    metrics["prediction_attributes"] = {
        k: dataset.json_attr(pred_attrs, k, pred_path) if isinstance(v, str) and v[:1] in ("[", "{") else v
        for k, v in pred_attrs.items()
        if k.startswith("prediction_")
    }
    record = to_json(metrics)
    title = (
        f"{what}\nvs {truth_path.name} ({side}^3, {units.voxel_size:g} Mpc/h voxels): "
        f"mean L1 {record['l1_mean']['model']:.4f} (stored units)"
    )
    draw = (lambda path: figure(path, pred, truth, record, units, title, z)) if plot else (lambda path: None)
    write_report(out_dir, stem, record, draw)
    log_summary(record)
    log.info("wrote %s", ", ".join(map(str, report_files(out_dir, stem, plot))))
    return record


def write_report(out_dir: Path, stem: str, record: dict, draw) -> None:
    """Write ``<stem>.png`` (``draw(path)``; a ``draw`` that writes nothing: no figure) and then
    ``<stem>.json`` into ``out_dir`` (made if missing), each atomically. A failed write (a full disk)
    leaves no part of a new report and no folder that this call made (:func:`one_set_or_none`).

    Raises:
        UserError: ``cannot write <file> (<reason>)``.
    """
    png, report = out_dir / f"{stem}.png", out_dir / f"{stem}.json"
    with one_set_or_none(out_dir, [png, report]):
        with writing(out_dir):
            out_dir.mkdir(parents=True, exist_ok=True)
        for path, write in ((png, draw), (report, lambda p: write_atomic(p, json.dumps(record, indent=1)))):
            with writing(path):
                write(path)


def log_summary(record: dict) -> None:
    """One line per channel (L1 model vs both baselines) and per spectrum (mean r, mean ratio, k where r < 0.9)."""
    for name, v in record["l1"].items():
        base = "no baseline" if v["baseline"] is None else f"baseline {v['baseline']:.5f}"
        non_ml = "no non-ML baseline" if v.get("non_ml") is None else f"non-ML {v['non_ml']:.5f}"
        log.info("L1 %-16s model %.5f, %s, %s", name, v["model"], base, non_ml)
    for name, s in record["power"].items():
        for tag, summary in s["summary"].items():
            k90 = summary["k_r_below_0.9"]
            log.info(
                "P(k) %-16s %-8s mean r %.3f, mean P ratio %.3f, r < 0.9 from k = %s",
                name,
                tag,
                summary["r_mean"] if summary["r_mean"] is not None else float("nan"),
                summary["ratio_mean"] if summary["ratio_mean"] is not None else float("nan"),
                "never" if k90 is None else f"{k90:.3g} h/Mpc",
            )


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("shared_data.inference.validate", __doc__.split("\n\n")[0])
    p.add_argument("--pred", required=True, help="prediction file (Hydro (N_out, L, L, L), e.g. from predict)")
    p.add_argument("--truth", required=True, help="truth file of the dataset contract (Nbody and Hydro)")
    p.add_argument("--out", required=True, help="folder for validation.json and validation.png")
    p.add_argument("--slice", type=int, help="index of the z slice shown (default: L // 2)")
    g = p.add_argument_group("units (for files without the attributes; a flag wins over an attribute)")
    g.add_argument("--voxel_size", type=float, help="voxel side in Mpc/h")
    g.add_argument("--density_scale", type=float, help="rho / <rho> = exp(s x)")
    g.add_argument("--temperature_scale", type=float, help="T = T0 exp(s x)")
    g.add_argument("--T0", dest="temperature_T0", type=float, help="T0 in K of the temperature transform")
    g.add_argument("--velocity_scale", type=float, help="km/s per stored velocity unit")
    g.add_argument("--igm_gamma", type=float, help="gamma of the IGM relation (temperature baselines)")
    g.add_argument("--k_jeans", type=float, help="k_J in h/Mpc of the non-ML baseline's Jeans filter")
    g.add_argument("--hydro_channels", help="comma-separated Hydro channel names (gas_density, gas_temperature, ...)")
    g.add_argument("--nbody_channels", help="comma-separated Nbody channel names (dm_density, dm_vx, ...)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from shared_data.runtime.logs import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging()
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a file, expected a folder")
    flags = {name: getattr(args, name) for name in QUANTITIES}
    validate_files(args.pred, args.truth, args.out, flags, args.slice)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
