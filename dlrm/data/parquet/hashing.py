"""The string hash of string and strings columns: stable 63-bit ids, the same on every rank, machine and run."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

# The string hash: FNV-1a 64 over the UTF-8 bytes, then splitmix64's finaliser (FNV's low bits mix
# poorly), the top bit cleared; id = hash % rows. Fixed constants: the same id on every rank, machine, run.
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_LOW63 = np.uint64(2**63 - 1)
LONG = 1024  # bytes: a longer string is hashed by its 16-byte BLAKE2b digest (one pass per byte is slow)


def hash_strings(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Stable 63-bit hashes (int64 [n], >= 0) of non-null strings: FNV-1a 64 of each string's UTF-8
    bytes, then splitmix64's finaliser, top bit cleared; a string longer than `LONG` bytes is hashed
    so by its 16-byte BLAKE2b digest instead. Vectorised over strings, one pass per byte position
    (strings sorted by length, so each pass touches only the strings that long)."""
    arr = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    arr = arr.cast(pa.large_string())
    if (
        len(arr)
        and int(np.max(np.diff(np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + len(arr) + 1])))
        > LONG
    ):
        arr = _digests_of_long(arr)
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.int64)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    data_buffer = arr.buffers()[2]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")
    starts, longest_first = offsets[:-1][order], lengths[order]
    h = np.full(n, _FNV_OFFSET, np.uint64)
    for j in range(int(longest_first[0]) if n else 0):
        k = int(np.searchsorted(-longest_first, -j, side="left"))  # strings longer than j
        h[:k] ^= data[starts[:k] + j].astype(np.uint64)
        h[:k] *= _FNV_PRIME
    h ^= h >> np.uint64(30)
    h *= _MIX1
    h ^= h >> np.uint64(27)
    h *= _MIX2
    h ^= h >> np.uint64(31)
    out = np.empty(n, np.int64)
    out[order] = (h & _LOW63).astype(np.int64)
    return out


def _digests_of_long(arr: pa.Array) -> pa.Array:
    """`arr` (large_string) with each string longer than `LONG` bytes replaced by its BLAKE2b-128 digest."""
    values = arr.cast(pa.large_binary()).to_pylist()
    short = [v if v is None or len(v) <= LONG else hashlib.blake2b(v, digest_size=16).digest() for v in values]
    return pa.array(short, pa.large_binary()).cast(pa.large_string(), safe=False)
