"""Generate a dataset file: ``python -m shared_data.data.generate --out data/train_128.h5 --size 128 --seed 1``.

Runs the physics of :mod:`shared_data.data.cosmology` and writes the tutorial's HDF5 layout
(``Nbody`` (4, L, L, L), ``Hydro`` (5, L, L, L), float32, channel-first, chunked so that a 64^3 crop
touches few chunks) with attributes for channel names, transforms, units, box, cosmology, seed, the
dark matter (``dm``: ``nbody``, the default, a particle-mesh N-body of CAMB's linear spectrum;
``zeldovich``, the truncated Zel'dovich approximation of the BBKS spectrum, whose files are those of
generator v4 bit for bit), the gas model (``gas``: ``nonlinear``, the default, with shocks, a
two-phase temperature and temperature-dependent smoothing; ``filtered``, the linear gas, whose files
with ``--dm zeldovich`` are those of generator v2 bit for bit), the linear ``spectrum`` and the
generator version.

Value transforms (each keeps the targets inside tanh's (-1, 1)):

* density (dark matter and gas): x = ln(max(rho, rho_floor)) / 14, inverted by rho = exp(14 x)
  (the tutorial's transform; ``lambda_rho`` compares in that space); rho_floor = 1e-3;
* temperature: x = ln(T / T0) / 8;
* velocity components: x = v / 2000 km/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core.commands import make_parser
from shared_data.core.errors import DatasetError, UserError, quoted, run_cli
from shared_data.core.files import check_writable, writing
from shared_data.data import cosmology, gas_physics, linear_field, nbody
from shared_data.data.dataset import npy_paths

DENSITY_SCALE = 14.0
RHO_FLOOR = 1e-3
TEMPERATURE_SCALE = 8.0
VELOCITY_SCALE = 2000.0  # km/s
GENERATOR_VERSION = 6  # changes whenever the same arguments give other values (the "generator" attribute)

NBODY_CHANNELS = ("dm_density", "dm_vx", "dm_vy", "dm_vz")
HYDRO_CHANNELS = ("gas_density", "gas_temperature", "gas_vx", "gas_vy", "gas_vz")


def density_transform(rho: np.ndarray) -> np.ndarray:
    """x = ln(max(rho, 1e-3)) / 14; rho in units of the mean density."""
    return np.log(np.maximum(rho, RHO_FLOOR)) / DENSITY_SCALE


def transform_fields(f: cosmology.Fields, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """Stack the transformed channels: ``(nbody (4, L, L, L), hydro (5, L, L, L))`` float32."""
    nbody = np.concatenate([density_transform(f.rho_dm)[None], f.v_dm / VELOCITY_SCALE])
    temp = np.log(np.maximum(f.temperature, 1e-30) / t0) / TEMPERATURE_SCALE
    hydro = np.concatenate([density_transform(f.rho_gas)[None], temp[None], f.v_gas / VELOCITY_SCALE])
    return nbody.astype(np.float32), hydro.astype(np.float32)


def attributes(args: argparse.Namespace, cosmo: linear_field.Cosmology, k_nl: float) -> dict:
    """File attributes describing channels, transforms, units, box, cosmology and generator settings.

    The transforms are given as text (``transforms``) and as numbers (``density_scale``,
    ``rho_floor``, ``temperature_scale`` with ``igm_T0_K``, ``velocity_scale_km_s``), which
    :mod:`shared_data.inference.units` reads to return to physical units.
    """
    transforms = {
        "density": f"x = ln(max(rho/rho_mean, {RHO_FLOOR})) / {DENSITY_SCALE}; rho/rho_mean = exp({DENSITY_SCALE} x)",
        "temperature": f"x = ln(T / T0) / {TEMPERATURE_SCALE}, T0 = {args.t0} K",
        "velocity": f"x = v / {VELOCITY_SCALE} km/s (peculiar velocity)",
    }
    return {
        "Nbody_channels": json.dumps(NBODY_CHANNELS),
        "Hydro_channels": json.dumps(HYDRO_CHANNELS),
        "Nbody_vector_channels": json.dumps([[1, 2, 3]]),
        "Hydro_vector_channels": json.dumps([[2, 3, 4]]),
        "transforms": json.dumps(transforms),
        "density_scale": DENSITY_SCALE,
        "rho_floor": RHO_FLOOR,
        "temperature_scale": TEMPERATURE_SCALE,
        "velocity_scale_km_s": VELOCITY_SCALE,
        "units": json.dumps(
            {"length": "Mpc/h (comoving)", "velocity": "km/s", "temperature": "K", "density": "mean density"}
        ),
        "layout": "channel-first (C, x, y, z)",
        "box_size_mpc_h": args.box,
        "grid_size": args.size,
        "redshift": args.redshift,
        "seed": args.seed,
        "cosmology": json.dumps({k: getattr(cosmo, k) for k in ("Omega_m", "Omega_b", "h", "n_s", "sigma8")}),
        "k_jeans_h_mpc": args.k_jeans,
        "k_nl_h_mpc": k_nl,
        "igm_T0_K": args.t0,
        "igm_gamma": args.gamma,
        "generator": f"shared_data.data.generate v{GENERATOR_VERSION}",
        "gas": args.gas,
        "gas_model": json.dumps(gas_model(args.gas)),
        "dm": args.dm,
        "dm_model": json.dumps(dm_model(args.dm)),
        "spectrum": cosmo.spectrum,
    }


def gas_model(gas: str) -> dict:
    """The gas model's description and constants (the ``gas_model`` attribute)."""
    if gas == "filtered":
        return {"name": gas, "what": "Jeans-filtered dark matter, T = T0 (rho_gas/<rho>)^(gamma-1)"}
    return {
        "name": gas,
        "what": "shock heating past shell crossing (Zel'dovich deformation, Rankine-Hugoniot), two-phase "
        "temperature (photo-heated relation with shear scatter + shock heat), Jeans smoothing at "
        "k_J (T/T0)^(-1/2), patchy He II reionization (a large-scale log10 T0 field)",
        "mu": gas_physics.MU,
        "shear_scatter_dex": gas_physics.SHEAR_SCATTER_DEX,
        "he2_dex": gas_physics.HE2_DEX,
        "he2_radius_mpc_h": gas_physics.HE2_RADIUS_MPC_H,
        "filter_log10_T_over_T0": gas_physics.FILTER_LOG_T.tolist(),
    }


def dm_model(dm: str) -> dict:
    """The dark matter's description and constants (the ``dm_model`` attribute)."""
    if dm == "zeldovich":
        return {"name": dm, "what": "Zel'dovich displacements truncated at k_nl, 2^3 particles per cell, TSC"}
    return {
        "name": dm,
        "what": "particle-mesh N-body (2LPT at z_start, FastPM kick-drift-kick steps linear in a, CIC force "
        "mesh deconvolved), one particle per cell; displacement and velocity carried to the grid by 2^3 "
        "Fourier-shifted particles per cell, TSC",
        "z_start": nbody.Z_START,
        "steps": nbody.STEPS,
        "mesh_factor": nbody.MESH_FACTOR,
    }


def write_h5(path: Path, nbody: np.ndarray, hydro: np.ndarray, attrs: dict, chunk: int) -> None:
    """Write the two datasets (chunks (1, c, c, c), or contiguous if ``chunk`` is 0) atomically, with
    ``Nbody_crc32`` / ``Hydro_crc32`` attributes: the CRC-32 of each channel's values
    (:func:`shared_data.data.dataset.channel_crc32`), which the readers that see whole channels check."""
    import h5py

    from shared_data.data.dataset import channel_crc32

    attrs = {**attrs, "Nbody_crc32": json.dumps(channel_crc32(nbody)), "Hydro_crc32": json.dumps(channel_crc32(hydro))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path), h5py.File(tmp, "w") as f:
            for key, data in (("Nbody", nbody), ("Hydro", hydro)):
                chunks = (1, *(min(chunk, data.shape[1]),) * 3) if chunk else None
                f.create_dataset(key, data=data, chunks=chunks)
            for k, v in attrs.items():
                f.attrs[k] = v
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def deposit_workers(args: argparse.Namespace) -> int:
    """``--workers``, or with 0 the automatic count: 1 below 128^3 (forking costs more than it saves),
    else one per core up to the 8 particle sub-lattices."""
    if args.workers:
        return args.workers
    return 1 if args.size < 128 else min(8, os.cpu_count() or 1)


#: The largest ``--seed``: NumPy's generator takes any integer >= 0, the file's ``seed`` attribute an int64.
MAX_SEED = 2**63 - 1


def generate(args: argparse.Namespace) -> Path:
    """Generate and write the file described by parsed ``args``; return its path."""
    out = Path(args.out)
    check_writable(out, "--out")  # before minutes of simulation
    if args.npy:
        for npy in npy_paths(out):
            check_writable(npy, "--npy output")
    if args.size < 8:
        raise UserError(f"--size {args.size}: expected at least 8 voxels")
    for name, value, ok, want in (
        (
            "--seed",
            args.seed,
            0 <= args.seed <= MAX_SEED,
            f"an integer in [0, {MAX_SEED}] (the file records it as int64)",
        ),
        ("--redshift", args.redshift, args.redshift >= 0, ">= 0"),
        ("--box", args.box, args.box > 0, "> 0"),
        ("--sigma8", args.sigma8, args.sigma8 > 0, "> 0"),
        ("--k_jeans", args.k_jeans, args.k_jeans > 0, "> 0"),
        ("--t0", args.t0, args.t0 > 0, "> 0"),
        ("--gamma", args.gamma, 1 <= args.gamma <= 2, "in [1, 2]"),
        ("--chunk", args.chunk, args.chunk >= 0, ">= 0"),
        ("--workers", args.workers, args.workers >= 0, ">= 0 (0: automatic)"),
    ):
        if not ok:
            raise UserError(f"{name} {quoted(value)}: expected {want}")
    cosmo = cosmology.cosmology_for(args.dm, sigma8=args.sigma8)
    t_start = time.perf_counter()
    say = lambda stage: print(f"[generate] {out.name}, {args.size}^3: {stage}", file=sys.stderr, flush=True)
    fields = cosmology.simulate(
        args.size,
        args.box,
        args.redshift,
        args.seed,
        cosmo,
        args.k_jeans,
        args.t0,
        args.gamma,
        on_stage=say,
        workers=deposit_workers(args),
        gas=args.gas,
        dm=args.dm,
    )
    nbody, hydro = transform_fields(fields, args.t0)
    worst = float(np.abs(hydro).max())
    if not worst < 1.0:
        raise DatasetError(
            f"{out}: generated target value {worst:.3f} is outside tanh's (-1, 1); lower --sigma8 or raise the box size"
        )
    say("writing")
    write_h5(out, nbody, hydro, attributes(args, cosmo, fields.k_nl), args.chunk)
    seconds = time.perf_counter() - t_start
    print(
        f"wrote {out}: Nbody {nbody.shape} Hydro {hydro.shape} float32, box {args.box} Mpc/h, "
        f"z={args.redshift}, seed {args.seed}, {args.dm} dark matter, {args.gas} gas, "
        f"k_nl={fields.k_nl:.3g} h/Mpc, {seconds:.1f} s"
    )
    return out


def stale_note(path: Path, gas: str = cosmology.GAS_MODELS[0], dm: str = cosmology.DM_MODELS[0]) -> str:
    """``""`` if ``path`` was written by this generator version with the ``gas`` model and ``dm`` dark
    matter, else a note that names its version, gas or dark matter and how to regenerate it (files of
    other writers, without a ``generator`` attribute, get ``""``; files of v2 hold the ``filtered`` gas)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            written_by, written_gas = f.attrs.get("generator"), f.attrs.get("gas", "filtered")
            written_dm = f.attrs.get("dm", "zeldovich")
    except OSError:
        return ""
    current = f"shared_data.data.generate v{GENERATOR_VERSION}"
    if written_by is None:
        return ""
    if str(written_by) != current:
        return f" (written by {written_by}, this is v{GENERATOR_VERSION}: delete it to regenerate)"
    if str(written_gas) != gas:
        return f" (it holds the {written_gas} gas, not --gas {gas}: delete it to regenerate)"
    if str(written_dm) != dm:
        return f" (it holds the {written_dm} dark matter, not --dm {dm}: delete it to regenerate)"
    return ""


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        "shared_data.data.generate",
        __doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, help="output HDF5 file")
    p.add_argument("--size", type=int, default=128, help="grid side L (voxels)")
    p.add_argument("--box", type=float, default=None, help="box side in Mpc/h (default: 0.25 Mpc/h per voxel)")
    p.add_argument("--redshift", type=float, default=2.0, help="output redshift z")
    p.add_argument("--seed", type=int, default=1, help="random seed of the initial field")
    p.add_argument("--sigma8", type=float, default=0.81, help="normalisation of the linear power spectrum")
    p.add_argument(
        "--gas",
        choices=cosmology.GAS_MODELS,
        default=cosmology.GAS_MODELS[0],
        help="gas model: nonlinear (shocks, two-phase temperature, temperature-dependent smoothing) or filtered "
        "(the linear gas: Jeans-filtered dark matter and T = T0 (1+delta)^(gamma-1), the files of generator v2)",
    )
    p.add_argument(
        "--dm",
        choices=cosmology.DM_MODELS,
        default=cosmology.DM_MODELS[0],
        help="dark matter: nbody (particle-mesh N-body of CAMB's linear spectrum) or zeldovich (truncated "
        "Zel'dovich of the BBKS spectrum, the files of generator v4 bit for bit)",
    )
    p.add_argument("--k_jeans", type=float, default=6.0, help="gas filtering wavenumber k_J in h/Mpc (at T0)")
    p.add_argument("--t0", type=float, default=1e4, help="IGM temperature at mean density T0 in K")
    p.add_argument("--gamma", type=float, default=1.6, help="slope of T = T0 (1+delta)^(gamma-1)")
    p.add_argument("--chunk", type=int, default=32, help="HDF5 chunk side (0: contiguous)")
    p.add_argument("--npy", action="store_true", help="also write the DHWC .npy files for DALI's numpy reader")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes for the particle deposit (0: 1 below 128^3, else up to 8, one per core; each holds "
        "~12 x size^3 x 8 bytes); the output does not depend on it",
    )
    p.add_argument("--if-missing", action="store_true", help="do nothing if --out exists")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.box is None:
        args.box = 0.25 * args.size
    out = Path(args.out)
    if args.if_missing and out.exists():
        print(f"{out} exists; not regenerated{stale_note(out, args.gas, args.dm)}")
    else:
        if out.exists():
            print(f"{out} exists: generating it again (--if-missing keeps an existing file)", flush=True)
        generate(args)
    if args.npy:
        from shared_data.data.convert import convert_to_npy

        convert_to_npy(out, skip_existing=args.if_missing)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
