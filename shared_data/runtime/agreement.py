"""The processes of a run agree on the experiment before they train; framework-neutral.

Every process of a multi-process run reads its own config (its command line, its YAML file) and its
own data files. Processes that differ in a value that shapes the experiment (a learning rate, the
number of crops, the net's widths) or in the data they read train a mixture of two experiments, hang
in a collective of another shape, or abort in the all-reduce. So at the start each process reduces
what it would train on to one row of 31-bit digests (:func:`fingerprint`: one per config key, one per
data file), the trainer gathers the rows of every process (``distribute.process_rows``, one small
collective) and :func:`check` refuses to start on any difference, naming the first key that differs
and the processes on each side.

Keys that only say where a process finds or writes things, or how fast it reads
(:data:`PER_PROCESS`), may differ: a node-local copy of the data at another path is the same data,
which the data files' digests check.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.config import Config
from shared_data.core.errors import UserError

#: Config keys a process may set for itself: places (its data's paths, the run and cache folders) and
#: host-side tuning that changes no number the run computes.
PER_PROCESS = frozenset(
    {
        "data_dir",
        "exp_dir",
        "train_path",
        "train_path_npy_data",
        "train_path_npy_label",
        "val_path",
        "val_path_npy_data",
        "val_path_npy_label",
        "xla_cache_dir",
        "progress_bar",
        "tensorboard",
        "num_data_workers",
        "dali_threads",
    }
)
#: The data files each process's digest covers, by config key.
DATA_KEYS = ("train_path", "val_path", "train_path_npy_data", "train_path_npy_label")
#: Bytes read from each end of a data file for its digest.
SAMPLE_BYTES = 1 << 16


def _digest(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF  # 31 bits: an int32 every framework gathers exactly


def data_digest(path: Path) -> str:
    """What identifies a data file across nodes: its size and a CRC-32 of its first and last
    :data:`SAMPLE_BYTES` (an HDF5 file's superblock, attributes and last chunks; a whole-file checksum
    of a volume of several GiB takes seconds a process). ``"missing"`` where the file cannot be read:
    the run's data check says why, after this."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(SAMPLE_BYTES)
            f.seek(max(size - SAMPLE_BYTES, 0))
            tail = f.read(SAMPLE_BYTES)
    except OSError:
        return "missing"
    return f"{size} bytes, crc32 {zlib.crc32(head + tail):08x}"


def fingerprint(cfg: Config) -> tuple[list[str], list[str], np.ndarray]:
    """This process's view of the experiment: the compared names (config keys not in
    :data:`PER_PROCESS`, then ``data <key>`` for each of :data:`DATA_KEYS`), their values as text, and one
    row of int32 digests (shape ``(len(names),)``, values in [0, 2**31)), in the same order on every
    process."""
    values = config_mod.config_dict(cfg)
    names, texts = [], []
    for key in sorted(values):
        if key not in PER_PROCESS:
            names.append(key)
            texts.append(json.dumps(values[key], sort_keys=True, default=str))
    for key in DATA_KEYS:  # every key on every process, set or not, so the rows have one length
        names.append(f"data {key}")
        texts.append(data_digest(cfg.resolve_path(values[key])) if values.get(key) else "unset")
    return names, texts, np.array([_digest(t) for t in texts], dtype=np.int32)


def check(names: list[str], texts: list[str], rows: np.ndarray, rank: int) -> None:
    """Refuse to start when the processes' rows (shape ``(processes, len(names))``, row ``r`` from
    process ``r``: :func:`fingerprint`'s digests gathered) differ.

    Raises:
        UserError: the first name (in :func:`fingerprint`'s order) whose digests differ, the processes
            that share this process's value and the others, and this process's value.
    """
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != len(names):
        raise UserError(
            f"the processes compare {rows.shape[-1] if rows.ndim else 0} config values where this one "
            f"has {len(names)}: every process must run the same version of the kit"
        )
    for column, name in enumerate(names):
        digests = rows[:, column]
        if (digests == digests[0]).all():
            continue
        same = [r for r in range(len(digests)) if digests[r] == digests[rank]]
        other = [r for r in range(len(digests)) if digests[r] != digests[rank]]
        raise UserError(
            f"the processes of this run disagree on {name}: process{'es' if len(same) > 1 else ''} "
            f"{_ranks(same)} (this one{f': {rank}' if len(same) > 1 else ''}) {texts[column][:120]}, "
            f"process{'es' if len(other) > 1 else ''} {_ranks(other)} another value; start every process with "
            "the same config and data"
        )


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
