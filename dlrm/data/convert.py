"""Convert delimited text (CSV/TSV with a header line) to Parquet that `data.source=parquet` reads.

    python -m dlrm.data.convert clicks.csv --out data/clicks --multi items --multi tags:string

Each input is read in blocks (`pyarrow.csv.open_csv`, streaming: memory bounded by the block size);
the column types are inferred from the first input's first block and then held for every input (a
later value that does not fit is an error naming the file). A `--multi COL` column holds several
values per row joined by `--multi-separator` ("3|17|5"; an empty cell: no values), written as
list<int64> (`COL:string`: list<string>, for `kind: strings`). Rows go to files part-00000.parquet,
part-00001.parquet, ... of --out, `--rows-per-file` each, in row groups of `--row-group-size` rows
(about global batch / ranks or fewer keeps each rank's reads small: see `dlrm.data.parquet`), in
the layout `dlrm.data.parquet.files.write_options` gives: numbers PLAIN-encoded (no dictionary: twice as
fast to decode), dictionary encoding for strings, `--compression` (snappy; none decodes a little faster);
`--required` declares every column non-nullable (Parquet's REQUIRED: no definition levels, about half
the decoding time again), refusing an input with an empty cell.
Each file is written under a temporary name and renamed when complete; --out must not be an input's
place nor hold Parquet files already. Errors: one line, exit status 2.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import refuse_alias
from dlrm.data.parquet.files import compute, write_options

COMPRESSIONS = ("snappy", "lz4", "zstd", "none")


class ConvertError(UserError):
    """Input text that cannot be converted: the message names the file, the column and the fix."""


def _delimiter(text: str) -> str:
    named = {"tab": "\t", "\\t": "\t", "comma": ",", "pipe": "|", "semicolon": ";"}
    d = named.get(text, text)
    if len(d) != 1:
        raise ConvertError(f"--delimiter {text!r}: give one character (or tab, comma, semicolon, pipe)")
    return d


def split_multi(column: pa.Array, separator: str, as_int: bool, where: str) -> pa.Array:
    """Strings like "3|17|5" -> list<int64> (or list<string>); an empty or null cell -> an empty list."""
    strings = pc.fill_null(column.cast(pa.string()), "")
    parts = compute("split_pattern", strings, options=pc.SplitPatternOptions(separator))
    flat = compute("list_flatten", parts)
    parent = compute("list_parent_indices", parts).to_numpy()
    keep = compute("not_equal", compute("utf8_trim_whitespace", flat), pa.scalar("")).to_numpy(zero_copy_only=False)
    counts = np.bincount(parent[keep], minlength=len(column))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    values = compute("utf8_trim_whitespace", flat.filter(pa.array(keep)))
    if as_int:
        try:
            values = values.cast(pa.int64())
        except pa.ArrowInvalid as e:
            raise ConvertError(
                f"{where}: {str(e).splitlines()[0]}; these values are not integers: give the column as "
                "COL:string (list<string>, hashed by the loader)"
            ) from None
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _blocks(
    path: str, delimiter: str, types: dict[str, pa.DataType] | None, multi: dict[str, bool], block_bytes: int
) -> Iterator[pa.RecordBatch]:
    convert = pacsv.ConvertOptions(column_types={**(types or {}), **{c: pa.string() for c in multi}})
    try:
        reader = pacsv.open_csv(
            path,
            read_options=pacsv.ReadOptions(block_size=block_bytes),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=convert,
        )
        header = reader.schema.names
        missing = [c for c in multi if c not in header]
        if missing:
            raise ConvertError(f"{path} has no column(s) {missing} (--multi); its header is {header}")
        if types is not None and list(types) != header:
            raise ConvertError(
                f"{path}'s header {header} differs from the first input's {list(types)}; convert them apart"
            )
        yield from reader
    except (pa.ArrowInvalid, OSError) as e:
        raise ConvertError(f"{path}: {str(e).strip().splitlines()[0]}; fix the file or the options") from None


# long: one streaming pass over the CSV, read top to bottom
def convert(
    inputs: Sequence[str],
    out: str,
    delimiter: str = ",",
    multi: Sequence[str] = (),
    separator: str = "|",
    rows_per_file: int = 1_000_000,
    row_group_size: int = 8192,
    block_bytes: int = 8 << 20,
    compression: str = "snappy",
    required: bool = False,
) -> dict:
    """Write `inputs` as Parquet files in `out`; returns {"files": [...], "rows": N, "schema": str}."""
    if rows_per_file < 1 or row_group_size < 1:
        raise ConvertError("--rows-per-file and --row-group-size must be positive")
    if compression not in COMPRESSIONS:
        raise ConvertError(f"--compression {compression!r}: choose one of {', '.join(COMPRESSIONS)}")
    lists = {}
    for m in multi:
        name, _, kind = m.partition(":")
        if kind not in ("", "int", "string"):
            raise ConvertError(f"--multi {m}: write COL (list<int64>), COL:int or COL:string (list<string>)")
        lists[name] = kind != "string"
    for i, path in enumerate(inputs):
        if not os.path.isfile(path):
            raise ConvertError(f"input {path} is not a file; give CSV/TSV files with a header line")
        refuse_alias(out, "--out", {f"input {i + 1}": path})
    out_dir = Path(out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.glob("*.parquet"))):
        raise ConvertError(f"--out {out} is a file or already holds Parquet files; choose a new or empty directory")
    out_dir.mkdir(parents=True, exist_ok=True)

    files: list[str] = []
    rows = 0
    types: dict[str, pa.DataType] | None = None
    schema: pa.Schema | None = None
    writer: pq.ParquetWriter | None = None
    tmp: str | None = None
    in_file = 0

    def finish() -> None:
        nonlocal writer, tmp, in_file
        if writer is not None and tmp is not None:
            writer.close()
            target = out_dir / f"part-{len(files):05d}.parquet"
            os.replace(tmp, target)
            files.append(str(target))
        writer, tmp, in_file = None, None, 0

    try:
        for path in inputs:
            for batch in _blocks(path, delimiter, types, lists, block_bytes):
                if types is None:  # the first block's types hold for every input
                    types = {f.name: f.type for f in batch.schema}
                columns = [
                    split_multi(batch.column(c), separator, lists[c], f"{path}, column {c!r}")
                    if c in lists
                    else batch.column(c)
                    for c in batch.schema.names
                ]
                table = pa.Table.from_arrays(columns, names=batch.schema.names)
                if schema is None:
                    schema = table.schema
                    if required:  # REQUIRED in Parquet: no definition levels to decode
                        schema = pa.schema([f.with_nullable(False) for f in table.schema])
                empty = [c for c in table.column_names if table.column(c).null_count] if required else []
                if empty:
                    raise ConvertError(
                        f"{path}: column {empty[0]!r} has an empty cell, and --required forbids them: fill it, "
                        "or drop --required"
                    )
                table = table.cast(schema)
                start = 0
                while start < table.num_rows:
                    if writer is None:
                        fd, tmp = tempfile.mkstemp(prefix=f".part-{len(files):05d}.tmp", dir=out_dir)
                        os.close(fd)
                        writer = pq.ParquetWriter(tmp, schema, **write_options(schema, compression))
                    n = min(table.num_rows - start, rows_per_file - in_file)
                    writer.write_table(table.slice(start, n), row_group_size=row_group_size)
                    start, in_file, rows = start + n, in_file + n, rows + n
                    if in_file == rows_per_file:
                        finish()
        finish()
    finally:
        if writer is not None:
            writer.close()
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    if not rows:
        raise ConvertError(f"the inputs {list(inputs)} hold no rows below their header; nothing written")
    return {"files": files, "rows": rows, "schema": str(schema)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.data.convert", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("inputs", nargs="+", help="CSV/TSV files with a header line")
    ap.add_argument("--out", required=True, help="output directory (new or empty)")
    ap.add_argument("--delimiter", default=",", help="one character, or tab, comma, semicolon, pipe")
    ap.add_argument(
        "--multi", action="append", default=[], help="COL or COL:string: a multi-valued column (repeat per column)"
    )
    ap.add_argument("--multi-separator", default="|", help="what separates the values of a --multi cell")
    ap.add_argument("--rows-per-file", type=int, default=1_000_000, help="rows per output file")
    ap.add_argument("--row-group-size", type=int, default=8192, help="rows per Parquet row group")
    ap.add_argument("--block-mb", type=float, default=8.0, help="text parsed per block (bounds memory)")
    ap.add_argument("--compression", default="snappy", help=f"of the Parquet pages: {', '.join(COMPRESSIONS)}")
    ap.add_argument(
        "--required", action="store_true", help="columns without nulls (REQUIRED): about twice as fast to read"
    )
    try:
        a = ap.parse_args(argv)
        if not 0 < a.block_mb <= 4096:
            raise ConvertError(f"--block-mb {a.block_mb}: give a size in MB in (0, 4096]")
        done = convert(
            a.inputs,
            a.out,
            _delimiter(a.delimiter),
            a.multi,
            a.multi_separator,
            a.rows_per_file,
            a.row_group_size,
            int(a.block_mb * (1 << 20)),
            a.compression,
            a.required,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"convert: wrote {done['rows']:,} rows in {len(done['files'])} file(s) to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
