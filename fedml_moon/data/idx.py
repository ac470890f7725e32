"""The IDX format (MNIST and Fashion-MNIST's files): read, plain or gzip, and written."""

from __future__ import annotations

import gzip
import hashlib
import threading
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedml_moon.data.file_error import DataFileError

IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
KEPT_FROM_BYTES = 1 << 20  # a gzip file this large is decompressed once per process (`read_idx`)
KEPT_BYTES = 1 << 27  # ... while the arrays kept hold at most 128 MiB (Fashion-MNIST's images: 55 MB)
_kept: dict[bytes, np.ndarray] = {}  # the compressed bytes' BLAKE2b digest -> its array, read-only
_kept_lock = threading.Lock()


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write uint8 `array` as an IDX file (what `read_idx` reads: Fashion-MNIST's format)."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    Path(path).write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def _idx_header(path: Path, raw: bytes) -> tuple[tuple[int, ...], np.dtype, int]:
    """An IDX file's dimensions, dtype (as stored: big-endian) and where its data start."""
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataFileError(path, f"truncated IDX header ({len(raw)} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    return dims, np.dtype(IDX_DTYPES[raw[2]]), 4 + 4 * ndim


def _read_plain_idx(path: Path, f: BinaryIO, head: bytes) -> np.ndarray:
    """A plain IDX file's data, read from the open `f` straight into the array."""
    dims, dtype, offset = _idx_header(path, head)
    data = np.empty(int(np.prod(dims)) if dims else 1, dtype=dtype)
    f.seek(offset)
    if f.readinto(memoryview(data).cast("B")) != data.nbytes or f.read(1):
        found = Path(path).stat().st_size - offset
        raise DataFileError(path, f"header says {dims} x {dtype.itemsize} bytes, found {found} (truncated?)")
    return data.astype(dtype.newbyteorder("="), copy=False).reshape(dims)


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (plain or gzip, told apart by the 1f 8b magic bytes) into an array.

    The header is two zero bytes, a dtype code (0x08 uint8, ...), the number of dimensions and one
    big-endian int32 per dimension; the data follow in C order. uint8 data come back as uint8. A
    plain file's data are read straight into the array (one copy of a large file, not two).

    A process decompresses a gzip file of `KEPT_FROM_BYTES` or more once and keeps its array, keyed
    by the digest of the bytes just read, so a file written again is decoded again (Fashion-MNIST's
    training images: a quarter of a second to decompress, 40 ms to digest; `fedml-moon check` runs
    a dozen runs in one process). The arrays kept hold at most `KEPT_BYTES` (the oldest go first; a
    larger file is not kept). Each call returns an array of its own.
    """
    with open(path, "rb") as f:
        head = f.read(4 + 4 * 255)  # the longest header
        if len(head) >= 4 and head[:2] == b"\x00\x00" and head[2] in IDX_DTYPES:  # plain, not gzip
            return _read_plain_idx(path, f, head)
    raw = Path(path).read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return _idx_array(path, raw)
    if len(raw) < KEPT_FROM_BYTES:
        return _idx_array(path, _gunzip(path, raw))
    key = hashlib.blake2b(raw, digest_size=32).digest()
    with _kept_lock:
        kept = _kept.get(key)
    if kept is not None:
        return kept.copy()
    array = _idx_array(path, _gunzip(path, raw))
    if array.nbytes <= KEPT_BYTES:
        kept = array.copy()
        kept.flags.writeable = False
        with _kept_lock:
            while _kept and sum(a.nbytes for a in _kept.values()) + kept.nbytes > KEPT_BYTES:
                _kept.pop(next(iter(_kept)))  # the oldest
            _kept[key] = kept
    return array


def _gunzip(path: Path, raw: bytes) -> bytes:
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as err:
        raise DataFileError(path, f"the gzip stream is truncated or corrupt ({err})") from None


def _idx_array(path: Path, raw: bytes) -> np.ndarray:
    """The array of an IDX file's (uncompressed) bytes."""
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_DTYPES:
        raise DataFileError(path, f"not an IDX file (header {raw[:4].hex()})")
    dims, dtype, offset = _idx_header(path, raw)
    count = int(np.prod(dims)) if dims else 1
    if len(raw) - offset != count * dtype.itemsize:
        found = len(raw) - offset
        raise DataFileError(path, f"header says {dims} x {dtype.itemsize} bytes, found {found} (truncated?)")
    data = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
    return data.astype(dtype.newbyteorder("="), copy=True).reshape(dims)
