"""Rows spread over a whole Parquet dataset: whole row groups chosen evenly over every file, so a
dataset written in time order is seen at its start, middle and end, not in its first rows."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from dlrm.data.parquet.files import ParquetDataError, list_files
from dlrm.data.progress import Progress


def _groups(fs, paths: list[str]) -> tuple[list[tuple[int, int, int]], pa.Schema]:
    """[(file, row group, rows)] of every non-empty row group, and the first file's schema (every
    file's must equal it)."""
    groups, schema = [], None
    for i, p in enumerate(paths):
        try:
            with fs.open_input_file(p) as f:
                meta = pq.ParquetFile(f).metadata
                this = meta.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as e:
            raise ParquetDataError(f"{p} is not a readable Parquet file ({str(e).splitlines()[0]})") from None
        if schema is None:
            schema = this
        elif not this.equals(schema):
            raise ParquetDataError(
                f"{p}'s columns differ from {paths[0]}'s; rewrite the files with one schema "
                "(python -m dlrm.data.convert)"
            )
        groups += [(i, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups) if meta.row_group(g).num_rows]
    if not groups or schema is None:
        raise ParquetDataError(f"the files {paths[:3]}... hold no rows")
    return groups, schema


def spread(groups: list[tuple[int, int, int]], rows: int) -> list[int]:
    """Indexes of row groups holding about `rows` rows, evenly spaced over `groups` (all of them if
    they hold no more), in order."""
    total = sum(g[2] for g in groups)
    if total <= rows:
        return list(range(len(groups)))
    want = max(1, round(len(groups) * rows / total))
    step = len(groups) / want
    return sorted({int(k * step + step / 2) for k in range(want)})


def sample(path: str, rows: int) -> tuple[pa.Table, int, int]:
    """About `rows` rows of the dataset at `path`, read as whole row groups spread over every file.

    Returns:
        (the sampled rows, the dataset's rows, its row groups).

    Raises:
        ParquetDataError: no files or rows, an unreadable file, schemas that differ, or duplicate column
            names.
    """
    fs, paths = list_files(path, "PATH")
    groups, schema = _groups(fs, paths)
    names = schema.names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ParquetDataError(f"{paths[0]} has duplicate column names {dupes}; rename them so each is unique")
    chosen = spread(groups, rows)
    progress = Progress("inspect: reading", len(chosen))
    parts, opened, taken = [], {}, 0
    for k, j in enumerate(chosen):
        f, g, _ = groups[j]
        if f not in opened:
            opened.clear()  # one file open at a time
            opened[f] = pq.ParquetFile(fs.open_input_file(paths[f]))
        try:
            part = opened[f].read_row_group(g)
        except (pa.ArrowException, OSError) as e:
            raise ParquetDataError(f"{paths[f]} row group {g} cannot be read ({str(e).splitlines()[0]})") from None
        parts.append(part)
        taken += part.num_rows
        progress.update(k + 1, taken)
    table = pa.concat_tables(parts)
    return table, sum(g[2] for g in groups), len(groups)
