"""Checksums of checkpoint files, both frameworks: recorded when a checkpoint is written, verified
before it is restored, so a checkpoint whose bytes changed on disk is never restored as if whole.

``<workdir>/checksums/<epoch>.json`` maps each file of the checkpoint of ``epoch`` (relative to the
checkpoint folder) to its size and CRC-32 (zlib's, the checksum the dataset files record). The
folder sits beside ``checkpoints/`` so neither orbax nor ``tf.train.CheckpointManager`` sees a file
it does not own. Computing it reads the checkpoint back once, from the page cache just after the
save: about a second per GiB of checkpoint on one core, once per epoch, never inside a step.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable
from pathlib import Path

from shared_data.core.errors import UserError
from shared_data.core.files import write_atomic

log = logging.getLogger("dlas")

CHUNK = 1 << 24


def file_crc32(path: Path) -> int:
    """zlib's CRC-32 of the file ``path``, read in 16 MiB chunks."""
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def manifest_path(directory: Path, epoch: int) -> Path:
    """Where the checksums of the checkpoint of ``epoch`` in the checkpoint folder ``directory`` live."""
    return Path(directory).parent / "checksums" / f"{epoch}.json"


def _entries(directory: Path, files: Iterable[Path]) -> dict[str, list[int]]:
    return {str(Path(f).relative_to(directory)): [Path(f).stat().st_size, file_crc32(f)] for f in sorted(files)}


def record(directory: Path, epoch: int, files: Iterable[Path], keep: Iterable[int]) -> None:
    """Write the checksums of ``files`` (the checkpoint of ``epoch`` in ``directory``) and remove those of
    checkpoints that are gone (``keep``: the epochs still there)."""
    path = manifest_path(directory, epoch)
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, json.dumps(_entries(directory, files), indent=0))
    kept = {f"{e}.json" for e in keep}
    for old in path.parent.glob("*.json"):
        if old.name not in kept:
            old.unlink(missing_ok=True)


def verify(directory: Path, epoch: int, files: Iterable[Path], where: str) -> None:
    """Compare ``files`` (the checkpoint of ``epoch``) with the checksums recorded at its save; a
    checkpoint without a record (written before records existed) restores with a warning.

    Raises:
        UserError: a file is missing, added, or differs in size or CRC-32 (named, with both values).
    """
    path = manifest_path(directory, epoch)
    if not path.is_file():
        log.warning("%s has no recorded checksums (%s): restored unverified", where, path)
        return
    try:
        want = json.loads(path.read_text())
    except ValueError:
        raise UserError(f"{where}: its checksum record {path} is damaged; it cannot be verified") from None
    have = _entries(directory, files)
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            w, h = (_describe(d.get(name)) for d in (want, have))
            raise UserError(f"{where} is damaged: {name} is {h}, expected {w} as recorded at its save")


def _describe(entry: list[int] | None) -> str:
    return "missing" if entry is None else f"{entry[0]} bytes with CRC-32 {entry[1]:08x}"
