"""The declared columns against the files: each column's Arrow type for its kind, one schema across files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from dlrm.data.parquet.files import ParquetDataError, RowGroup, list_files


def type_problem(t: pa.DataType, kind: str) -> str | None:
    """Why Arrow type `t` cannot be read as `kind` (dense, label, id, ids, string, strings, weight,
    weights), with the fix; None if it can."""
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    inner = t.value_type if is_list else None
    is_str = pa.types.is_string(t) or pa.types.is_large_string(t)
    number = pa.types.is_integer(t) or pa.types.is_floating(t)
    if kind in ("dense", "weight"):
        return None if number else f"is {t}, not a number column" + ("; a list column is not dense" if is_list else "")
    if kind == "label":
        return None if number or pa.types.is_boolean(t) else f"is {t}, not a 0/1 label column"
    if kind == "weights":
        return (
            None
            if is_list and (pa.types.is_floating(inner) or pa.types.is_integer(inner))
            else f"is {t}, not list<float>"
        )
    ok = {
        "id": pa.types.is_integer(t),
        "ids": is_list and pa.types.is_integer(inner),
        "string": is_str,
        "strings": is_list and (pa.types.is_string(inner) or pa.types.is_large_string(inner)),
    }[kind]
    if ok:
        return None
    actual = next(
        (
            k
            for k, fits in (
                ("id", pa.types.is_integer(t)),
                ("ids", is_list and inner is not None and pa.types.is_integer(inner)),
                ("string", is_str),
                (
                    "strings",
                    is_list and inner is not None and (pa.types.is_string(inner) or pa.types.is_large_string(inner)),
                ),
            )
            if fits
        ),
        None,
    )
    return f"is {t}, declared kind {kind}" + (f": declare kind: {actual}" if actual else "")


class Dataset:
    """The files of one split: their metadata, checked against the declared columns, and row groups."""

    def __init__(self, uri: str, key: str, columns: dict[str, tuple[str, str]]):
        """Open and check the files of `uri` (a directory, a glob or one file).

        Args:
            uri: where the files are, local or a URI pyarrow.fs opens.
            key: the config key that gives `uri`, for messages.
            columns: {column: (kind as `type_problem` takes it, the config key that declares it)}.

        Raises:
            ParquetDataError: no files, an unreadable or empty file, a missing column, a column of the
                wrong type for its kind, or schemas that differ between files.
        """
        self.fs, self.paths = list_files(uri, key)
        self.metadata: list[pq.FileMetaData] = []
        self.row_groups: list[RowGroup] = []
        self.types: dict[str, pa.DataType] = {}
        for i, path in enumerate(self.paths):
            try:
                with self.fs.open_input_file(path) as f:
                    parquet = pq.ParquetFile(f)
                    md, schema = parquet.metadata, parquet.schema_arrow
            except (pa.ArrowException, OSError) as e:
                raise ParquetDataError(
                    f"{path} is not a readable Parquet file ({str(e).splitlines()[0]}): truncated or another "
                    "format; rewrite it (python -m dlrm.data.convert) or remove it"
                ) from None
            if md.num_rows == 0:
                raise ParquetDataError(f"{path} has no rows; remove it or write rows to it")
            for column, (kind, ckey) in columns.items():
                if column not in schema.names:
                    raise ParquetDataError(
                        f"{path} has no column {column!r} ({ckey}); its columns are {schema.names}: fix {ckey}"
                    )
                t = schema.field(column).type
                problem = type_problem(t, kind)
                if problem:
                    raise ParquetDataError(f"column {column!r} ({ckey}) of {path} {problem}")
                if column in self.types and self.types[column] != t:
                    raise ParquetDataError(
                        f"column {column!r} is {self.types[column]} in {self.paths[0]} but {t} in {path}: the "
                        "files' schemas differ; rewrite them with one schema"
                    )
                self.types.setdefault(column, t)
            first = 0
            for g in range(md.num_row_groups):
                rows = md.row_group(g).num_rows
                if rows:
                    self.row_groups.append(RowGroup(i, g, rows, first))
                first += rows
            self.metadata.append(md)
