"""Guards a run passes before it touches anything: its data files exist and hold finite values in range,
the host memory holds what the loader keeps there, the address space left holds compiling, training and
a checkpoint save, the TensorBoard folder can be written; and, after a loss turns non-finite, whether the
step's crops are the cause (:func:`batch_problem`).

Each check raises one :class:`shared_data.core.errors.UserError` (or ``DatasetError``) line naming the
file, value or limit and the fix. The trainers call them through :class:`shared_data.runtime.run_folder.RunFolder`;
the benchmark and the ladder call them before they compile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from pathlib import Path

import numpy as np

from shared_data.core import loader_kinds
from shared_data.core.commands import command_name
from shared_data.core.config import Config
from shared_data.core.errors import DatasetError, UserError
from shared_data.core.files import check_writable
from shared_data.data.cosmology import GAS_MODELS
from shared_data.model import unet_spec
from shared_data.runtime import memory
from shared_data.runtime.memory import format_bytes

log = logging.getLogger("dlas")


def generate_command(cfg: Config, split: str) -> str:
    """The command that makes the missing data file of ``split`` for ``cfg``: the generator with the
    file's own path, the side and gas its name carries (``train_128.h5`` -> 128;
    ``val_128_filtered.h5`` -> 128 and ``--gas filtered``, as the GPU recipes name the linear gas's
    files; else 4 crops for train, 2 for val, and the generator's default gas), the kit's seeds (1
    train, 2 val) and ``--npy`` for DALI's numpy reader. A path outside the current folder whose
    folder does not exist (the tutorial's ``/data/...``) is replaced by ``data/<its name>`` and the
    ``--set <split>_path=`` that points the config at it."""
    path = cfg.data_file(split)
    named = re.search(rf"_(\d+)(?:_({'|'.join(GAS_MODELS)}))?\.h5$", path.name)
    side = int(named.group(1)) if named else cfg.crop_size * (4 if split == "train" else 2)
    gas = f" --gas {named.group(2)}" if named and named.group(2) else ""
    npy = " --npy" if loader_kinds.loader_kind(cfg).reads_npy else ""
    generate = command_name("shared_data.data.generate")
    try:
        out, point = path.relative_to(Path.cwd()), ""
    except ValueError:  # outside the current folder: its own path if its folder exists, else data/<name>
        out, point = path, ""
        if not path.parent.is_dir():
            out = Path("data") / path.name
            point = f", then pass --set {split}_path={out}"
    seed = 1 if split == "train" else 2
    return f"{generate} --out {out} --size {max(side, cfg.crop_size)} --seed {seed}{gas}{npy}{point}"


def check_data_files(cfg: Config, splits: tuple[str, ...] = ("train", "val")) -> None:
    """Check that the data files of ``cfg``'s ``splits`` exist, before the run folder is made (or a
    benchmark compiles its step).

    Raises:
        DatasetError: a split's HDF5 file is missing; the message gives the command that makes it
            (:func:`generate_command`).
    """
    if not loader_kinds.loader_kind(cfg).uses_files:
        return
    missing = [split for split in splits if not cfg.data_file(split).exists()]
    if missing:
        files = " and ".join(str(cfg.data_file(split)) for split in missing)
        commands = "; ".join(generate_command(cfg, split) for split in missing)
        raise DatasetError(
            f"dataset file{'' if len(missing) == 1 else 's'} {files} not found; "
            f"make {'it' if len(missing) == 1 else 'them'} with: {commands}"
        )


def check_data(cfg: Config) -> None:
    """Check, before anything in a run folder is touched, that the data of ``cfg`` exist and follow the
    contract: both split files (unless ``synthetic``) and, for the DALI numpy reader, their ``.npy``
    twins. The values every loader reads (the HDF5 files, or the twins) are scanned for NaN, inf and
    values beyond :data:`shared_data.data.dataset.MAX_ABS_VALUE`, targets beyond the model's output
    range :data:`~shared_data.data.dataset.TARGET_LIMIT`, inputs beyond
    :data:`~shared_data.data.dataset.INPUT_LIMIT` (one read of each file: 0.23 s for a 256^3
    volume), so a bad value is named with its file and voxel before the first step, not
    reported as a diverged loss. Raises the :class:`shared_data.core.errors.DatasetError` naming
    the file and the fix."""
    from shared_data.data import dataset

    kind = loader_kinds.loader_kind(cfg)
    if not kind.uses_files:
        return
    infos = [
        dataset.validate(cfg.data_file(split), cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
        for split in ("train", "val")
    ]
    if kind.host_reader == "inmem":
        check_host_memory(cfg, sum(i.size**3 * (i.n_in + i.n_out) * 4 for i in infos))
    t0 = time.perf_counter()
    for split, info in zip(("train", "val"), infos):
        if kind.reads_npy:
            dataset.check_npy_twins(info, cfg.npy_files(split))
            inputs, targets = cfg.npy_files(split)
            dataset.check_finite_npy(inputs)
            dataset.check_finite_npy(targets, targets=True)
        else:
            dataset.scan_values(info.path)
    log.info(
        "data values: finite, inputs within +-%g, targets within +-%g, in both files (checked in %.1f s)",
        dataset.INPUT_LIMIT,
        dataset.TARGET_LIMIT,
        time.perf_counter() - t0,
    )


def check_tensorboard_folder(folder: Path) -> None:
    """Check, before the steps are compiled, that the run's TensorBoard folder can be written (a file
    or a dangling link in its place, a read-only folder: :func:`shared_data.core.files.check_writable`).

    Raises:
        UserError: one line naming the folder, what is in the way and how to run without it.
    """
    try:
        check_writable(folder, "the run's TensorBoard folder", folder=True)
    except UserError as err:
        raise UserError(f"{err}; --set tensorboard=false runs without TensorBoard records") from None


def available_memory_bytes() -> int | None:
    """The host memory this process may still take: the least of the kernel's ``MemAvailable``, the
    cgroup's limit minus its usage (a batch job's allocation) and ``RLIMIT_AS``; None if none is known."""
    import resource

    limits = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        limits.append(int(next(line for line in meminfo if line.startswith("MemAvailable")).split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    return min(limits) if limits else None


def check_host_memory(cfg: Config, needed: int) -> None:
    """Refuse, before reading anything, an ``inmem`` run whose volumes (``needed`` bytes) exceed the
    memory this process may take (:func:`available_memory_bytes`).

    Raises:
        UserError: the bytes needed and available, and the loaders that read crops from the files.
    """
    available = available_memory_bytes()
    if available is not None and needed > available:
        raise UserError(
            f"data_loader_config {cfg.data_loader_config!r} holds both volumes in host memory: "
            f"{format_bytes(needed)} needed, {format_bytes(available)} available to this process; "
            f"use --data_loader_config lowmem (each crop read from the file) or dali-npy"
        )


#: Address space a checkpoint save takes besides two copies of the train state: the threads orbax,
#: TensorStore and TensorFlow start for it (their stacks count under ``ulimit -v``; TensorStore's pool
#: grows with the cores: :data:`SAVE_RESERVE_PER_CORE`) and their buffers, with the malloc arenas
#: capped (:func:`cap_malloc_arenas`); about twice what a first save of ``cpu_tiny`` took on 2 cores.
SAVE_RESERVE_BYTES = 256 * 2**20
SAVE_RESERVE_PER_CORE = 16 * 2**20


def check_train_memory(cfg: Config, framework: str) -> None:
    """Refuse to start a run whose ``ulimit -v`` leaves less address space, after its framework has
    loaded, than compiling, training and its first checkpoint save take
    (:data:`~shared_data.runtime.memory.TRAIN_RESERVE_BYTES` plus :func:`save_memory_needed`):
    TensorFlow aborts natively when it runs out there (:mod:`shared_data.runtime.memory`).

    Raises:
        UserError: the limit, the address space left and needed, and by how much to raise the limit.
    """
    memory.check_address_space(
        framework,
        "train",
        "compiling, training and the first checkpoint save",
        memory.TRAIN_RESERVE_BYTES + save_memory_needed(cfg),
        "nothing is trained",
    )


def save_memory_needed(cfg: Config) -> int:
    """Address space a checkpoint save of ``cfg``'s train state needs at the least: two copies of the
    float32 parameters, Adam's two moments and the weight average (``ema_decay``), and
    :data:`SAVE_RESERVE_BYTES` plus :data:`SAVE_RESERVE_PER_CORE` per core."""
    copies = 3 + (1 if cfg.ema_decay else 0)
    reserve = SAVE_RESERVE_BYTES + SAVE_RESERVE_PER_CORE * (os.cpu_count() or 1)
    return reserve + 2 * 4 * copies * unet_spec.num_params(cfg)


#: The largest density value x whose exp(density_scale x) (the ``lambda_rho`` loss term) float32
#: holds, times density_scale: ln(3.4028235e38).
LOG_FLOAT32_MAX = float(np.log(np.finfo(np.float32).max))


def batch_problem(cfg: Config, epoch: int, step: int, replicas: int) -> str | None:
    """Why the training batch of ``step`` (0-based, in ``epoch``; every replica's crops) makes the
    loss non-finite, if its data does: each crop is read again from the training file (the crops
    every loader reads, :func:`shared_data.data.host_batches.make_plan`) and checked for NaN, inf and
    values beyond :data:`shared_data.data.dataset.MAX_ABS_VALUE`, and, with ``lambda_rho``, for a
    target density whose exp(``density_scale`` x) overflows float32.

    Returns:
        the file, crop and value at fault; ``""`` when the crops are fine; None when the loader
        reads no file (``synthetic``).
    """
    if not loader_kinds.loader_kind(cfg).uses_files:
        return None
    from shared_data.data import crop_readers, host_batches

    s = cfg.crop_size
    reader = crop_readers.H5LowMemReader(cfg.data_file("train"), cfg.N_in_channels, cfg.N_out_channels, s)
    plan = host_batches.make_plan(cfg, host_batches.TRAIN, epoch, range(replicas), replicas, reader.size)
    buf_in = np.empty((cfg.N_in_channels, s, s, s), np.float32)
    buf_tar = np.empty((cfg.N_out_channels, s, s, s), np.float32)
    limit = LOG_FLOAT32_MAX / cfg.density_scale
    for start in plan.draws[step].starts:
        try:
            reader.read(start, buf_in, buf_tar)
        except DatasetError as err:
            return str(err)
        density = buf_tar[cfg.density_channel]
        if cfg.lambda_rho and density.max() > limit:
            i = tuple(np.argwhere(density > limit)[0])
            x, y, z = (int(a) + int(b) for a, b in zip(i, start))
            return (
                f"{reader.path}: Hydro channel {cfg.density_channel} (density) holds {density[i]:.6g} at voxel "
                f"({x}, {y}, {z}), beyond {limit:.4g}, where exp({cfg.density_scale:g} x) of the lambda_rho "
                "loss term overflows float32"
            )
    return ""
