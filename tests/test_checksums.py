"""Checkpoint checksums: each file's blocks get the CRC-32 of their bytes (computed on threads), a
record of the older form (whole-file CRC-32s) still verifies, and a change names the file, its block
and both CRC-32s."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from shared_data.core.errors import UserError
from shared_data.runtime import checksums


def _files(folder, sizes):
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate(sizes):
        path = folder / f"d{i}"
        path.write_bytes(rng.integers(0, 256, size, np.uint8).tobytes())
        paths.append(path)
    return paths


def test_each_blocks_crc32_is_zlibs_of_its_bytes(tmp_path):
    """Blocks of 1000 bytes: a file of 2500 bytes has three (the last 500 bytes), one of exactly 2000
    has two, an empty one none; each value is zlib.crc32 of that slice of the file's bytes."""
    paths = _files(tmp_path, [2500, 2000, 0, 999])
    got = checksums.block_crc32s(paths, block=1000)
    for path in paths:
        data = path.read_bytes()
        assert got[path] == [zlib.crc32(data[i : i + 1000]) for i in range(0, len(data), 1000)]
    assert [len(got[p]) for p in paths] == [3, 2, 0, 1]


def _checkpoint(tmp_path, sizes):
    directory = tmp_path / "checkpoints"
    (directory / "2" / "d").mkdir(parents=True)
    return directory, _files(directory / "2" / "d", sizes)


def test_a_changed_byte_names_its_block_and_both_crcs(tmp_path, monkeypatch):
    monkeypatch.setattr(checksums, "BLOCK", 1000)
    directory, files = _checkpoint(tmp_path, [2500, 700])
    checksums.record(directory, 2, files, [2])
    checksums.verify(directory, 2, files, "checkpoint c/2")  # as written: no error
    record = json.loads(checksums.manifest_path(directory, 2).read_text())
    assert record["block_bytes"] == 1000 and record["files"]["2/d/d1"] == [700, [zlib.crc32(files[1].read_bytes())]]
    written = files[0].read_bytes()
    changed = bytearray(written)
    changed[1500] ^= 0xFF
    files[0].write_bytes(bytes(changed))
    with pytest.raises(UserError) as err:
        checksums.verify(directory, 2, files, "checkpoint c/2")
    was, now = zlib.crc32(written[1000:2000]), zlib.crc32(bytes(changed[1000:2000]))
    assert str(err.value) == (
        f"checkpoint c/2 is damaged: 2/d/d0 is 2500 bytes with CRC-32 {now:08x} in its bytes 1000-1999, "
        f"expected {was:08x} as recorded at its save"
    )
    files[0].write_bytes(written)
    files[1].write_bytes(files[1].read_bytes()[:600])
    with pytest.raises(UserError, match=r"2/d/d1 is 600 bytes, expected 700 as recorded at its save$"):
        checksums.verify(directory, 2, files, "checkpoint c/2")
    files[0].unlink()
    with pytest.raises(UserError, match=r"2/d/d0 is missing, expected 2500 bytes as recorded at its save$"):
        checksums.verify(directory, 2, files[1:], "checkpoint c/2")


def test_a_record_of_whole_file_crcs_still_verifies(tmp_path):
    """The older record (name -> [size, CRC-32 of the whole file]) passes while the files are as
    written and names both whole-file CRC-32s once one changes."""
    directory, files = _checkpoint(tmp_path, [3000])
    data = files[0].read_bytes()
    path = checksums.manifest_path(directory, 2)
    path.parent.mkdir()
    path.write_text(json.dumps({"2/d/d0": [3000, zlib.crc32(data)]}))
    checksums.verify(directory, 2, files, "checkpoint c/2")
    files[0].write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(UserError) as err:
        checksums.verify(directory, 2, files, "checkpoint c/2")
    assert str(err.value) == (
        f"checkpoint c/2 is damaged: 2/d/d0 is 3000 bytes with CRC-32 {zlib.crc32(files[0].read_bytes()):08x}, "
        f"expected 3000 bytes with CRC-32 {zlib.crc32(data):08x} as recorded at its save"
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ('{"files": {"2/d/d0": [3000, [1, 2]]}}', "block_bytes is None, expected a positive integer"),
        (
            '{"block_bytes": 1000, "files": {"2/d/d0": [3000, [1]]}}',
            "the entry of '2/d/d0' is [3000, [1]], expected [size, [the CRC-32 of each block]]",
        ),
        ('{"block_bytes": 0, "files": {"2/d/d0": [3000, [1]]}}', "block_bytes is 0, expected a positive integer"),
        ('{"block_bytes": true, "files": {}}', "block_bytes is True, expected a positive integer"),
        (
            '{"block_bytes": 1000, "files": {"2/d/d0": [3000, [1, "2", 3]]}}',
            "the entry of '2/d/d0' is [3000, [1, '2', 3]], expected [size, [the CRC-32 of each block]]",
        ),
        ('{"block_bytes": 1000, "files": ["2/d/d0"]}', "files is a JSON list, expected an object"),
        ('[{"block_bytes": 1000}]', "a JSON list, expected an object"),
        ('{"2/d/d0": [3000, "abc"]}', "the entry of '2/d/d0' is [3000, 'abc'], expected [size, CRC-32]"),
        ('{"2/d/d0": 3000}', "the entry of '2/d/d0' is 3000, expected [size, CRC-32]"),
        ('{"2/d/d0": [3000, 4294967296]}', "the entry of '2/d/d0' is [3000, 4294967296], expected [size, CRC-32]"),
        ('{"block_bytes": 10, "files": {"d": [1, [%s]]}}' % ", ".join(["1"] * 500), "the entry of 'd' is [1, [1, 1"),
    ],
)
def test_a_damaged_record_is_one_error(tmp_path, text, reason):
    """Not JSON, not an object, a block size that is not a positive integer (0 divided by it), files
    not an object, an entry not [size, CRC-32s] (a CRC-32 a string, another number of blocks than the
    size gives): the record is damaged, and the error says what is wrong in a short quote."""
    directory, files = _checkpoint(tmp_path, [3000])
    path = checksums.manifest_path(directory, 2)
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(UserError) as err:
        checksums.verify(directory, 2, files, "checkpoint c/2")
    message = str(err.value)
    assert message.startswith(f"checkpoint c/2: its checksum record {path} is damaged ({reason}")
    assert message.endswith("); it cannot be verified") and len(message) < 400
