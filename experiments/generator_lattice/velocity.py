"""Does the lattice show in the velocities too? v1 against v2 (this tree), 128^3, seed 1.

``python experiments/generator_lattice/velocity.py | tee experiments/generator_lattice/results/velocity.txt``

Runs :func:`shared_data.data.cosmology.simulate` of ``--before`` (a commit, unpacked with ``git archive``)
and of the working tree on the same realisation and prints, for the dark-matter and the gas velocity
(the three components' power summed), over 1/4 <= k / k_Nyquist < 1: the power in modes within 10
degrees of a grid axis of v1 relative to v2, over the same ratio for all other modes (the axis excess
of v1 over v2), v1's power over v2's, and the rms of v1 - v2 over the rms of v2. CPU only.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from shared_data.data.linear_field import wavenumbers

REPO = Path(__file__).resolve().parents[2]


def load(root: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, root / "shared_data" / "data" / "cosmology.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="c4d499f")
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args()
    size, box = args.size, 0.25 * args.size
    with tempfile.TemporaryDirectory() as old_root:
        archive = subprocess.run(
            ["git", "archive", args.before, "shared_data"], cwd=REPO, check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", old_root], input=archive.stdout, check=True)
        old, new = load(Path(old_root), "cosmology_before"), load(REPO, "cosmology_now")
        fo = old.simulate(size, box, 2.0, 1, old.Cosmology(), 6.0, 1e4, 1.6)
    fn = new.simulate(size, box, 2.0, 1, new.Cosmology(), 6.0, 1e4, 1.6, dm="zeldovich")
    kx, ky, kz = wavenumbers(size, box)
    k = np.sqrt(kx**2 + ky**2 + kz**2)
    k_nyq = np.pi * size / box
    shell = (k >= 0.25 * k_nyq) & (k < k_nyq)
    kmax = np.maximum(np.maximum(np.abs(kx), np.abs(ky)), np.abs(kz))
    along = shell & (kmax >= np.cos(np.radians(10.0)) * np.where(k > 0, k, 1))
    other = shell & ~along
    print(f"{size}^3, seed 1, v1 = {args.before} against v2 = working tree")
    for name, a, b in (("dark-matter velocity", fo.v_dm, fn.v_dm), ("gas velocity", fo.v_gas, fn.v_gas)):
        pa = sum(np.abs(np.fft.rfftn(c)) ** 2 for c in a)
        pb = sum(np.abs(np.fft.rfftn(c)) ** 2 for c in b)
        excess = (pa[along].sum() / pb[along].sum()) / (pa[other].sum() / pb[other].sum())
        rms = np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2))
        print(
            f"{name:>21}: axis excess v1/v2 {excess:.3f}, high-k power v1/v2 {pa[shell].sum() / pb[shell].sum():.3f}, "
            f"rms(v1 - v2) / rms(v2) {rms:.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
