"""`.npy` files written as a stream: rows appended without knowing their count, parts joined, rows shuffled.

Headers are numpy's own (`numpy.lib.format`, version 1.0), which pads the shape so that the row count
can grow in place: the header is rewritten with the final shape when the file is closed;
`concat_parts` joins part files while hashing them.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np

from dlrm.common.io import publish, sha256_file


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """numpy's version-1.0 .npy header for a C-ordered array; its length does not depend on the row count."""
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue()


def data_offset(f: BinaryIO) -> int:
    """Where the data of the .npy file `f` starts (after its magic string and header)."""
    f.seek(0)
    np.lib.format.read_magic(f)
    np.lib.format.read_array_header_1_0(f)
    return f.tell()


class NpyWriter:
    """Append rows to a .npy file without knowing the final row count; `close` writes the shape."""

    def __init__(self, path: str, dtype, cols: int):
        self.path, self.dtype, self.cols, self.rows = path, np.dtype(dtype), cols, 0
        self._f = open(path, "wb")
        self._f.write(npy_header(self.dtype, (0, cols)))

    def append(self, arr: np.ndarray) -> None:
        assert arr.dtype == self.dtype and arr.ndim == 2 and arr.shape[1] == self.cols, (arr.dtype, arr.shape)
        self._f.write(np.ascontiguousarray(arr).data)
        self.rows += arr.shape[0]

    def close(self) -> None:
        header = npy_header(self.dtype, (self.rows, self.cols))
        assert len(header) == len(npy_header(self.dtype, (0, self.cols))), "the .npy header grew"
        self._f.seek(0)
        self._f.write(header)
        self._f.close()


def concat_parts(part_paths: Sequence[str], out_path: str, dtype, cols: int) -> tuple[int, str]:
    """Concatenate streamed part .npy files into `out_path`; returns (rows, sha256 of the file)."""
    if len(part_paths) == 1:
        publish(part_paths[0], out_path)
        rows = np.load(out_path, mmap_mode="r").shape[0]
        return rows, sha256_file(out_path)
    rows = sum(np.load(p, mmap_mode="r").shape[0] for p in part_paths)
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        head = npy_header(np.dtype(dtype), (rows, cols))
        out.write(head)
        h.update(head)
        for p in part_paths:
            with open(p, "rb") as f:
                f.seek(data_offset(f))
                while chunk := f.read(1 << 22):
                    out.write(chunk)
                    h.update(chunk)
            os.remove(p)
    return rows, h.hexdigest()


def shuffle_rows(paths: dict[str, str], seed: int, day: int, block_rows: int = 1 << 18) -> None:
    """Permute the rows of a day's .npy files in place (same permutation for all), block by block.

    Reads the source memory-mapped, so memory is bounded by the permutation (8 bytes a row) and a block.
    """
    rows = np.load(paths["labels"], mmap_mode="r").shape[0]
    perm = np.random.default_rng([seed, day]).permutation(rows)
    for path in paths.values():
        src = np.load(path, mmap_mode="r")
        out = NpyWriter(path + ".shuffled", src.dtype, src.shape[1])
        for i in range(0, rows, block_rows):
            idx = perm[i : i + block_rows]
            order = np.argsort(idx)  # read in file order, write in permuted order
            block = np.empty((len(idx), src.shape[1]), src.dtype)
            block[order] = src[idx[order]]
            out.append(block)
        out.close()
        del src
        publish(path + ".shuffled", path)
