"""Reading rows of a split: its row groups in order, the last few kept decoded."""

from __future__ import annotations

from collections import OrderedDict

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
    """Reads rows of a split's ordered row groups, keeping the last few row groups decoded (one per
    generator: a ParquetFile is not shared between threads)."""

    def __init__(self, dataset: Dataset, columns: list[str]):
        self.dataset, self.columns = dataset, columns
        self.files: dict[int, pq.ParquetFile] = {}
        self.cache: OrderedDict[int, pa.Table] = OrderedDict()

    def group(self, g: int) -> pa.Table:
        if g in self.cache:
            self.cache.move_to_end(g)
            return self.cache[g]
        rg = self.dataset.row_groups[g]
        if rg.file not in self.files:
            path = self.dataset.paths[rg.file]
            local = isinstance(self.dataset.fs, pafs.LocalFileSystem)  # memory-mapped: no copy out of the page cache
            handle = pa.memory_map(path) if local else self.dataset.fs.open_input_file(path)
            self.files[rg.file] = pq.ParquetFile(handle, metadata=self.dataset.metadata[rg.file])
        try:
            table = self.files[rg.file].read_row_group(rg.index, columns=self.columns)
        except (pa.ArrowException, OSError) as e:
            raise ParquetValueError(
                f"{self.dataset.paths[rg.file]}: row group {rg.index} cannot be read ({str(e).splitlines()[0]}); "
                "rewrite or remove the file"
            ) from None
        self.cache[g] = table
        while len(self.cache) > CACHED_ROW_GROUPS:
            self.cache.popitem(last=False)
        return table

    def read(self, order: list[int], starts: np.ndarray, start: int, count: int) -> tuple[pa.Table, list[tuple]]:
        """Rows [start, start + count) of the row groups `order` (starts: their first rows), and where
        they come from: [(first row in the batch, file path, first row in the file), ...]."""
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
