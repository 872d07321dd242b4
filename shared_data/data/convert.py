"""Convert a dataset file to the DHWC ``.npy`` twins DALI's numpy reader crops with ROI.

``python -m shared_data.data.convert data/train_128.h5`` writes ``data/train_128_Nbody.npy``
(L, L, L, 4) and ``data/train_128_Hydro.npy`` (L, L, L, 5), float32, channels last (the tutorial's
``convert_to_npy``), each with a ``.source.json`` record of the HDF5 file it was made from. The source
is checked against the dataset contract first (channel-first, cubic, float32), so a channels-last or
otherwise foreign file is refused instead of being transposed wrongly. Slabs along x are copied one
at a time, so volumes larger than memory convert. Both twins are written to temporary files first and
replace the earlier twins together once both are whole, so a failure or a stop (SIGTERM, Ctrl-C: one
line, exit code 143 / 130) leaves the earlier twins as they were.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shared_data.core.commands import make_parser
from shared_data.core.errors import exit_after_atexit, run_cli
from shared_data.core.files import atomic_path, check_not_input, check_writable, one_set_or_none, writing
from shared_data.data import dataset

SLAB = 16


def convert_to_npy(path: str | Path, n_in: int = 4, n_out: int = 5, skip_existing: bool = False) -> tuple[Path, Path]:
    """Write the DHWC ``.npy`` twins of HDF5 file ``path`` (atomically; a failure leaves neither new
    twin nor its record); return their paths.

    ``skip_existing`` keeps twins that already match ``path`` (:func:`shared_data.data.dataset.check_npy_twins`).

    Raises:
        DatasetError: ``path`` is missing, damaged, not of the dataset contract (``n_in``/``n_out``
            channels first, a cube, float32) or holds NaN/inf.
        UserError: an output cannot be written (a folder in its place, a read-only folder, a full disk).
    """
    path = Path(path)
    info = dataset.validate(path, n_in, n_out)
    outs = dataset.npy_paths(path)
    if skip_existing and all(p.exists() for p in outs):
        try:
            dataset.check_npy_twins(info, outs)
            print(f"{outs[0].name}, {outs[1].name} match {path.name}; not reconverted")
            return outs
        except dataset.DatasetError as err:
            print(f"reconverting: {err}")
    check_not_input(twin_files([path]), {"input": path}, ".npy twins")
    for out in outs:
        check_writable(out, "output")
    written = []
    # the twins and their records are one set: a failure (a full disk) leaves the pair or none of it; the
    # twins replace the earlier ones together, once both are whole (the renames when `renames` closes),
    # and a stop signal from then on waits until the records are written (STOPS.held)
    with STOPS.after_commit(path), one_set_or_none(path.parent, list(twin_files([path]).values())):
        with dataset.open_h5(path) as f, contextlib.ExitStack() as renames:
            for key, out in zip(dataset.KEYS, outs):
                tmp = renames.enter_context(atomic_path(out, suffix=".npy"))
                checksum = dataset.ChannelChecksum(info.path, info.attrs, key)
                written.append(_write_twin(path, key, f[key], checksum, out, tmp))
            STOPS.held = True
        for out in outs:
            with writing(dataset.source_record(out)):
                dataset.write_source_record(out, path)
    print("\n".join(written))
    return outs


def _write_twin(path: Path, key: str, ds, checksum, out: Path, tmp: Path) -> str:
    """Copy dataset ``key`` of ``path`` (``ds``, C x L x L x L) to ``tmp`` as the DHWC ``.npy`` twin ``out``,
    slab by slab, checked finite and against ``checksum`` (its :class:`~shared_data.data.dataset.ChannelChecksum`);
    return the line that says so."""
    c, size = ds.shape[0], ds.shape[1]
    with writing(out):
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(*ds.shape[1:], c))
        reserve(tmp)  # a full disk is an OSError here, not a SIGBUS at a page of the mapping
        for x0 in range(0, size, SLAB):
            with dataset.reading(path, f"{key} (x from {x0})"):
                slab = ds[:, x0 : x0 + SLAB].astype(np.float32)
            dataset.check_finite(slab, f"{path} {key} (x from {x0})")
            checksum.update(slab)
            mm[x0 : x0 + SLAB] = np.moveaxis(slab, 0, -1)
        mm.flush()
        del mm
        checksum.verify()  # before the .npy replaces anything
    return f"wrote {out}: shape {(*ds.shape[1:], c)} float32 (DHWC)"


def reserve(path: Path) -> None:
    """Allocate every block of ``path`` (its current size) on disk now (``posix_fallocate``, where
    the system has it): writes through a memory map into a sparse file on a full disk end the
    process with SIGBUS instead of an error.

    Raises:
        OSError: ENOSPC (or the file system's refusal) when the blocks are not there.
    """
    if hasattr(os, "posix_fallocate"):
        with open(path, "rb+") as fh:
            os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)


def twin_files(files: Sequence[str | Path]) -> dict[str, Path]:
    """Every file that converting ``files`` writes: each one's ``.npy`` twins and their records."""
    outputs = {}
    for path in files:
        for npy in dataset.npy_paths(path):
            outputs[f"output {npy.name}"] = npy
            outputs[f"output {dataset.source_record(npy).name}"] = dataset.source_record(npy)
    return outputs


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("shared_data.data.convert", __doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="HDF5 dataset files")
    p.add_argument("--n_in", type=int, default=4, help="Nbody channels (default: %(default)s)")
    p.add_argument("--n_out", type=int, default=5, help="Hydro channels (default: %(default)s)")
    args = p.parse_args(argv)
    check_not_input(twin_files(args.files), {f"input {f}": f for f in args.files}, ".npy twins")
    previous = {signum: signal.signal(signum, STOPS.stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        for path in args.files:
            convert_to_npy(path, args.n_in, args.n_out)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


class _Stopped(KeyboardInterrupt):
    """A conversion stopped by a signal: its line, and exit code 128 + the signal (:func:`run_cli`).
    ``converted``: the file whose twins were just written whole (the stop waited for them), else None."""

    def __init__(self, signum: int, converted: Path | None = None):
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        if converted is None:
            what = "the .npy twins of the file being converted are as they were before"
        else:
            what = f"the .npy twins of {converted} are written whole, with their records"
        super().__init__(f"stopped by {name}: {what} (the files converted before it are whole)")


class _Stops:
    """SIGTERM and SIGINT during :func:`main`: a :class:`_Stopped` raised at once, except while
    :attr:`held` (the new twins replace the earlier ones and their records are written: one set that
    a stop would break, and :func:`~shared_data.core.files.one_set_or_none` would then remove the new
    and the earlier files alike), when it waits until the set is complete."""

    def __init__(self):
        self.held, self.pending = False, None

    def stop(self, signum: int, frame=None) -> None:
        if self.held:
            self.pending = self.pending or signum
            return
        raise _Stopped(signum)

    @contextlib.contextmanager
    def after_commit(self, path: Path):
        """Around the conversion of ``path``: a signal that waited while :attr:`held` is raised once
        the set is complete (the new twins and records of ``path`` are whole)."""
        self.held, self.pending = False, None
        try:
            yield
        finally:
            self.held = False
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise _Stopped(signum, path)


STOPS = _Stops()


if __name__ == "__main__":
    # ended after the atexit functions, before the interpreter's finalisation resets the signal handlers
    # (a stop there would end the process without its sentence)
    exit_after_atexit(run_cli(main))
