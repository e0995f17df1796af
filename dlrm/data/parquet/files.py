"""A dataset's files: listing them (local paths or URIs), their row groups, the layout we write, and the
errors that name a file."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from dlrm.common.errors import UserError

_GLOB = set("*?[")


def compute(name: str, *args, options=None):
    """pyarrow.compute's function `name` (its module attributes are made at import: type checkers miss them)."""
    return pc.call_function(name, list(args), options)


class ParquetDataError(UserError):
    """Parquet files that do not fit data.parquet: the message names the file, the column and the fix."""

    same_on_all_ranks = True  # every rank checks the same files' metadata at start-up


class ParquetValueError(ParquetDataError):
    """A bad value in the rows one rank reads (null, id out of range, label not 0/1)."""

    same_on_all_ranks = False  # each rank reads its own rows


def write_options(schema: pa.Schema, compression: str = "snappy") -> dict:
    """`pq.write_table` / `pq.ParquetWriter` keyword arguments of the layout the Parquet source decodes
    fastest: numbers PLAIN-encoded, dictionary encoding for string columns only, `compression` (snappy,
    lz4, zstd or none). Files of any encoding are read alike."""
    strings = []
    for f in schema:
        is_list = pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        t = f.type.value_type if is_list else f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            strings.append(f"{f.name}.list.element" if is_list else f.name)  # the Parquet leaf's path
    return {"use_dictionary": strings, "compression": compression}


@dataclass(frozen=True)
class RowGroup:
    """Row group `index` of file `file` (an index into the dataset's files): `rows` rows, the first
    being row `first_row` of the file."""

    file: int
    index: int
    rows: int
    first_row: int


def list_files(uri: str, key: str) -> tuple[pafs.FileSystem, list[str]]:
    """(filesystem, sorted file paths) of a directory (its *.parquet, recursively), a glob or one file;
    local paths or URIs that pyarrow.fs opens (file://, s3://, gs://, hdfs://)."""
    glob_at = min((i for i, c in enumerate(uri) if c in _GLOB), default=None)
    cut = len(uri) if glob_at is None else uri.rfind("/", 0, glob_at) + 1
    base_uri, rest = uri[:cut] or ".", uri[cut:]  # the directory above the first glob character, the pattern
    try:
        if "://" in base_uri:
            fs, base = pafs.FileSystem.from_uri(base_uri)
        else:
            fs, base = pafs.LocalFileSystem(), os.path.abspath(base_uri)
        if glob_at is not None:
            pattern = base.rstrip("/") + "/" + rest
            infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
            files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, pattern)]
        else:
            info = fs.get_file_info(base)
            if info.type == pafs.FileType.NotFound:
                raise ParquetDataError(f"{key} = {uri!r}: no such file or directory; point it at your Parquet files")
            if info.type == pafs.FileType.File:
                files = [base]
            else:
                infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
                files = [
                    i.path
                    for i in infos
                    if i.type == pafs.FileType.File
                    and i.path.endswith(".parquet")
                    and not any(p.startswith((".", "_")) for p in i.path[len(base) :].split("/"))
                ]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise ParquetDataError(
            f"{key} = {uri!r} cannot be opened ({str(e).splitlines()[0]}); fix the path or URI"
        ) from None
    if not files:
        raise ParquetDataError(f"{key} = {uri!r} holds no Parquet files (*.parquet); write some there or fix the path")
    return fs, sorted(files)
