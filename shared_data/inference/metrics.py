"""The metrics of a predicted volume against its truth: what ``validate`` writes to ``validation.json``.

:func:`compute_metrics` takes stored volumes and their :class:`~shared_data.inference.units.Units`
and gives:

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

Arrays stay NumPy in :func:`compute_metrics`' result; :func:`to_json` makes it JSON.
"""

from __future__ import annotations

import math

import numpy as np

from shared_data.data import gas_physics, linear_field
from shared_data.inference.units import DENSITY, DM_DENSITY, TEMPERATURE, Units, linear

#: Bins of the one-point PDFs (:func:`pdfs`).
PDF_BINS = 60
#: The r(k) below which a spectrum's summary names the first k (``k_r_below_0.9``).
R_THRESHOLD = 0.9
#: The floor of the density transform x = ln(max(rho, floor)) / s, for the non-ML baseline's stored values.
RHO_FLOOR = 1e-3


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


def linear_and_log(name: str, x: np.ndarray, units: Units) -> tuple[np.ndarray, np.ndarray]:
    """Stored gas density or temperature ``x`` as the field whose overdensity the spectra take and as
    the variable of its PDF: rho and log10(rho / <rho>), or T in K and log10(T / K) (float64). Where
    exp(scale x) leaves float64's range (a stored value of order 50 or more: a file of other
    transforms), the field is rho / max(rho) (its overdensity is the same) and the logarithms are
    computed from ``x`` itself, so every finite volume gives finite metrics."""
    with np.errstate(over="ignore", under="ignore"):
        f = linear(name, x, units)
    if np.all(np.isfinite(f)) and f.min() > 0:
        return f, (np.log10(f / f.mean()) if name == DENSITY else np.log10(f))
    y = (units.density_scale if name == DENSITY else units.temperature_scale) * np.asarray(x, np.float64)
    y -= y.max()
    with np.errstate(under="ignore"):
        f = np.exp(y)
    if name == DENSITY:
        return f, (y - np.log(f.mean())) / np.log(10)
    return f, np.log10(units.temperature_T0) + (y + units.temperature_scale * float(np.max(x))) / np.log(10)


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
        stored = {"pred": pred[c], "baseline": base, "non_ml": filtered}
        fields = {"true": linear_and_log(name, truth[c], units)}
        fields |= {tag: linear_and_log(name, x, units) for tag, x in stored.items() if x is not None}
        t, others = fields.pop("true")[0], {tag: f for tag, (f, _) in fields.items()}
        s = spectra(t, others, box, edges)
        s["summary"] = {"model": spectrum_summary(s, "pred")}
        for tag in ("baseline", "non_ml"):
            if tag in others:
                s["summary"][tag] = spectrum_summary(s, tag)
        s["baseline_is"], s["non_ml_is"] = what, filtered_is
        power[name] = s
        logs = {"true": linear_and_log(name, truth[c], units)[1]} | {tag: g for tag, (_, g) in fields.items()}
        pdf[name] = {"variable": "log10(rho/<rho>)" if name == DENSITY else "log10(T/K)", **pdfs(logs)}
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
