"""Reading rows of a split: its row groups in order, the last few kept decoded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dlrm.data.parquet.files import ParquetValueError
from dlrm.data.parquet.schema import Dataset

CACHED_ROW_GROUPS = 4  # decoded row groups a reader keeps (consecutive slices share them)


class Split:
    """A split's row groups (indexes into its dataset's) and, per epoch, their order."""

    def __init__(self, dataset: Dataset, groups: list[int]):
        self.dataset, self.groups = dataset, groups
        self.rows = sum(dataset.row_groups[g].rows for g in groups)


class RowGroupReader:
    """Reads rows of a split's ordered row groups, keeping the last few row groups decoded.

    Safe to share between threads: each thread opens its own file handles, and a row group another
    thread is decoding is waited for, not decoded twice.

    Args:
        dataset: the split's files and row groups.
        columns: the columns to read.
        prepare: table -> table, applied once to each decoded row group (work done once per row
            group rather than per batch).
    """

    def __init__(self, dataset: Dataset, columns: list[str], prepare: Callable[[pa.Table], pa.Table] | None = None):
        self.dataset, self.columns, self.prepare = dataset, columns, prepare
        self.cache: OrderedDict[int, pa.Table] = OrderedDict()
        self.capacity = CACHED_ROW_GROUPS
        self._local = threading.local()  # per thread: {file index: ParquetFile}
        self._lock = threading.Lock()
        self._decoding: dict[int, threading.Event] = {}

    def share(self, threads: int) -> RowGroupReader:
        """This reader, its cache widened for `threads` threads reading neighbouring batches."""
        self.capacity = CACHED_ROW_GROUPS + max(0, threads - 1)
        return self

    def group(self, g: int) -> pa.Table:
        """Row group `g` of the dataset, decoded (and prepared)."""
        while True:
            with self._lock:
                if g in self.cache:
                    self.cache.move_to_end(g)
                    return self.cache[g]
                pending = self._decoding.get(g)
                if pending is None:
                    self._decoding[g] = threading.Event()
            if pending is None:
                break
            pending.wait()  # another thread decodes it; then taken from the cache (or decoded again if evicted)
        try:
            table = self._decode(g)
            with self._lock:
                self.cache[g] = table
                while len(self.cache) > self.capacity:
                    self.cache.popitem(last=False)
        finally:
            with self._lock:
                self._decoding.pop(g).set()
        return table

    def _decode(self, g: int) -> pa.Table:
        rg = self.dataset.row_groups[g]
        files = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = {}
        if rg.file not in files:
            path = self.dataset.paths[rg.file]
            local = isinstance(self.dataset.fs, pafs.LocalFileSystem)  # memory-mapped: no copy out of the page cache
            handle = pa.memory_map(path) if local else self.dataset.fs.open_input_file(path)
            files[rg.file] = pq.ParquetFile(handle, metadata=self.dataset.metadata[rg.file])
        try:
            table = files[rg.file].read_row_group(rg.index, columns=self.columns)
        except (pa.ArrowException, OSError) as e:
            raise ParquetValueError(
                f"{self.dataset.paths[rg.file]}: row group {rg.index} cannot be read ({str(e).splitlines()[0]}); "
                "rewrite or remove the file"
            ) from None
        return self.prepare(table) if self.prepare is not None else table

    def read(self, order: list[int], starts: np.ndarray, start: int, count: int) -> tuple[pa.Table, list[tuple]]:
        """Rows [start, start + count) of the row groups `order` read as one sequence.

        Args:
            order: row group indexes, in reading order.
            starts: [len(order) + 1] the first row of each in the sequence, then the total.
            start: the sequence's first row to read.
            count: rows to read.

        Returns:
            (the rows as one table, where they come from: [(first row in the batch, file path, first
            row in the file), ...]).
        """
        pieces, origin, at = [], [], 0
        i = int(np.searchsorted(starts, start, side="right")) - 1
        while count > 0:
            rg = self.dataset.row_groups[order[i]]
            a = start - int(starts[i])
            n = min(count, rg.rows - a)
            pieces.append(self.group(order[i]).slice(a, n))
            origin.append((at, self.dataset.paths[rg.file], rg.first_row + a))
            start, count, at, i = start + n, count - n, at + n, i + 1
        return pa.concat_tables(pieces).combine_chunks(), origin
