"""The sample-weight column (data.parquet.weight) of a batch's rows, checked: finite numbers >= 0."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dlrm.data.parquet.files import ParquetValueError


def _where(origin: list[tuple], row: int) -> str:
    """'file F, row R' of a batch's row (origin: [(first row in the batch, path, first row in the file)])."""
    at, path, first = max((o for o in origin if o[0] <= row), key=lambda o: o[0])
    return f"{path}, row {first + row - at}"


def sample_weights(table: pa.Table, column: str, origin: list[tuple]) -> np.ndarray:
    """The rows' weights [b] float32 from `column` of `table` (b rows; `origin`: where they come from).

    Raises:
        ParquetValueError: a null, NaN, infinite or negative weight; names the column, file and row.
    """
    arr = table.column(column)
    arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    with np.errstate(over="ignore", invalid="ignore"):
        weights = arr.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float32)  # nulls: NaN
    bad = ~(np.isfinite(weights) & (weights >= 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = arr[row].as_py()
        raise ParquetValueError(
            f"sample-weight column {column!r} (data.parquet.weight) holds {value} at {_where(origin, row)}: a "
            "weight must be a finite number >= 0; fix the row, or set data.parquet.weight=null to train unweighted"
        )
    return weights
