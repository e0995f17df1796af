"""The time period of each row group of a dataset (`data.parquet.periods.key`): from Hive-style
directories (`day=3/part-0.parquet`) or from a column whose row groups each hold one value."""

from __future__ import annotations

from dlrm.config.periods import in_range, period_sort_key
from dlrm.data.parquet.files import ParquetDataError
from dlrm.data.parquet.schema import Dataset


def hive_value(path: str, key: str) -> str | None:
    """The value of the innermost `key=value` directory of `path`, or None."""
    for part in reversed(path.split("/")[:-1]):
        name, eq, value = part.partition("=")
        if eq and name == key:
            return value
    return None


def row_group_periods(dataset: Dataset, key: str) -> list[str]:
    """The period of each of `dataset.row_groups` (in their order): its file's `key=value` directory,
    else the one value the row group's statistics give for column `key`.

    Raises:
        ParquetDataError: neither says, naming the file (no such directory, no such column, no
            statistics, or a row group holding several periods).
    """
    periods: list[str] = []
    for rg in dataset.row_groups:
        path = dataset.paths[rg.file]
        value = hive_value(path, key)
        if value is None:
            value = _column_value(dataset, rg.file, rg.index, key)
        periods.append(value)
    return periods


def _column_value(dataset: Dataset, file: int, index: int, key: str) -> str:
    path, md = dataset.paths[file], dataset.metadata[file]
    row_group = md.row_group(index)
    names = [row_group.column(j).path_in_schema for j in range(row_group.num_columns)]
    if key not in names:
        raise ParquetDataError(
            f"{path} is in no {key}=... directory and has no column {key!r} (data.parquet.periods.key): put each "
            f"period's files under {key}=VALUE/ or write the period in a column {key!r}"
        )
    stats = row_group.column(names.index(key)).statistics
    if stats is None or not stats.has_min_max or stats.min != stats.max:
        raise ParquetDataError(
            f"{path}: row group {index} holds several values of {key!r} (or no statistics): write each period to its "
            f"own row groups (sort by {key!r}, one file per period) or its own {key}=VALUE/ directory"
        )
    value = stats.min
    return value.decode() if isinstance(value, bytes) else str(value)


def ordered(values: list[str]) -> list[str]:
    """The distinct periods of `values` in time order (`period_sort_key`)."""
    return sorted(set(values), key=period_sort_key)


def window_groups(periods: list[str], bounds: list[str], exclude: list[str] | None = None) -> list[int]:
    """Indexes of the row groups whose period is in [first, last] (`bounds`; [] = any period not in
    `exclude`'s range), in time order (file order within a period)."""
    if bounds:
        chosen = [g for g, p in enumerate(periods) if in_range(p, bounds)]
    else:
        chosen = [g for g, p in enumerate(periods) if not (exclude and in_range(p, exclude))]
    return sorted(chosen, key=lambda g: period_sort_key(periods[g]))
