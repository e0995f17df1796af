"""Convert delimited text (CSV/TSV with a header line) to Parquet that `data.source=parquet` reads.

    python -m dlrm.data.convert clicks.csv --out data/clicks --multi items --multi tags:string

Inputs are read in streaming blocks (memory bounded by the block size). Column types are inferred
from the first input's first block and held for every input; integers beyond float64's exact range
are kept exact as uint64 or string. A `--multi COL` column holds several values per row joined by
`--multi-separator` ("3|17|5"; an empty cell: no values), written as list<int64> (`COL:string`:
list<string>). Rows go to part-00000.parquet, part-00001.parquet, ... of --out, `--rows-per-file`
each, in row groups of `--row-group-size` rows, numbers PLAIN-encoded, strings dictionary-encoded,
`--compression` (snappy); `--required` declares every column non-nullable and refuses empty cells.
The files are published whole (a temporary directory renamed to --out, which must be absent or
empty) when every input is converted. Bad input (no or bad header, a value that does not fit its
column, a cell that is not UTF-8, a full disk) is one line naming file, line and column, exit 2.
"""

from __future__ import annotations

import csv
import errno
import os
import re
import shutil
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
from dlrm.common.io import publish_dir, refuse_alias
from dlrm.data.parquet.files import compute, write_options
from dlrm.data.progress import Progress

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


_INTEGER = re.compile(r"^\s*-?\d+\s*$")
_NUMBER = re.compile(r"^\s*-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def check_header(path: str, delimiter: str) -> list[str]:
    """The header's names; ConvertError for a header that is not UTF-8, names repeated, a line of values
    instead of names (a headerless file), or one name holding tabs or semicolons (another delimiter)."""
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except OSError as e:
        raise ConvertError(f"{path}: {e.strerror or e}") from None
    try:
        line = first.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise ConvertError(
            f"{path}, line 1 (the header): byte {e.start} is not UTF-8; re-encode the file (iconv -f latin1 -t utf-8)"
        ) from None
    names = next(csv.reader([line], delimiter=delimiter)) if line else []
    if len(names) == 1 and delimiter != "\t" and "\t" in line:
        raise ConvertError(f"{path}: its header is one name holding tabs: a TSV; give --delimiter tab")
    numbers = sum(1 for n in names if n == "" or _NUMBER.match(n))
    if names and numbers >= max(2, len(names) // 2):
        raise ConvertError(
            f"{path}, line 1 holds values, not column names ({line[:50]!r}): a headerless file (Criteo's TSV: "
            "python -m dlrm.data.criteo.preprocess reads it); add a header line"
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConvertError(f"{path}, line 1: column name(s) {dupes} repeated; give each column its own name")
    return names


def _line_of(path: str, delimiter: str, after: int, column: int, value: str) -> int:
    """The line of `path` (1-based, the header line 1) after data row `after` whose `column` holds `value`."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        for k, row in enumerate(csv.reader(f, delimiter=delimiter)):
            if k > after and column < len(row) and row[column] == value:
                return k + 1
    return after + 2


def _exact_integers(path: str, delimiter: str, names: list[str], types: dict, block_bytes: int) -> dict:
    """`types` with each float64 column whose first block's cells are all integers that a double cannot
    hold exactly (beyond 2**53) typed uint64 (when all are in its range) or string: ids stay exact."""
    doubles = [n for n, t in types.items() if pa.types.is_floating(t)]
    if not doubles:
        return types
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(block_size=block_bytes),
        parse_options=pacsv.ParseOptions(delimiter=delimiter),
        convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in doubles}, include_columns=doubles),
    )
    first = reader.read_next_batch()
    fixed = dict(types)
    for n in doubles:
        cells = [v.strip() for v in first.column(n).to_pylist() if v is not None and v.strip()]
        if cells and all(_INTEGER.match(v) for v in cells) and any(abs(int(v)) > 2**53 for v in cells):
            fits = all(0 <= int(v) < 2**64 for v in cells)
            fixed[n] = pa.uint64() if fits else pa.string()
    return fixed


def _blocks(
    path: str, delimiter: str, types: dict[str, pa.DataType] | None, multi: dict[str, bool], block_bytes: int
) -> Iterator[pa.RecordBatch]:
    header = check_header(path, delimiter)
    missing = [c for c in multi if c not in header]
    if missing:
        raise ConvertError(f"{path} has no column(s) {missing} (--multi); its header is {header}")
    if types is not None and list(types) != header:
        raise ConvertError(f"{path}'s header {header} differs from the first input's {list(types)}; convert them apart")
    read = pacsv.ReadOptions(block_size=block_bytes)
    parse = pacsv.ParseOptions(delimiter=delimiter)
    done = 0
    try:
        if types is None:  # the first block's types, with exact integers kept exact
            probe = pacsv.open_csv(path, read_options=read, parse_options=parse)
            inferred = {f.name: f.type for f in probe.schema}
            types = _exact_integers(path, delimiter, header, inferred, block_bytes)
        column_types = {**types, **{c: pa.string() for c in multi}}
        reader = pacsv.open_csv(
            path,
            read_options=read,
            parse_options=parse,
            convert_options=pacsv.ConvertOptions(column_types=column_types),
        )
        for batch in reader:
            binary = [f.name for f in batch.schema if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
            if binary:
                raise ConvertError(
                    f"{path}, column {binary[0]!r} (near line {done + 2}): a cell is not UTF-8 text (a Latin-1 file?); "
                    "re-encode the file (iconv -f latin1 -t utf-8)"
                )
            yield batch
            done += batch.num_rows
    except pa.ArrowInvalid as e:
        message = str(e).strip().splitlines()[0]
        bad = re.search(r"column #(\d+): CSV conversion error to (\w+): invalid value '(.*)'", message)
        if bad:
            k, to, value = int(bad.group(1)), bad.group(2), bad.group(3)
            line = _line_of(path, delimiter, done, k, value)
            raise ConvertError(
                f"{path}, line {line}, column {header[k]!r}: {value[:40]!r} is not {to}, the type its first rows "
                "gave it; fix the value, or make every row of the column one type"
            ) from None
        raise ConvertError(f"{path}: {message}; fix the file or the options") from None
    except OSError as e:
        raise ConvertError(f"{path}: {str(e).strip().splitlines()[0]}; fix the file or the options") from None


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
    """Write `inputs` as Parquet files in `out`, published whole.

    Args:
        inputs: CSV/TSV files with a header line, one schema.
        out: the output directory, absent or empty.
        multi: columns holding several values per cell ("COL", or "COL:string" for strings).
        separator: what separates a multi column's values.
        block_bytes: text parsed per block (bounds memory).
        required: declare every column non-nullable (an empty cell is refused).

    Returns:
        {"files": [paths], "rows": rows written, "schema": the Arrow schema as text}.

    Raises:
        ConvertError: bad options, or input that does not convert (names file, line and column).
    """
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
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConvertError(f"--out {out} exists and is not an empty directory; choose a new or empty directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.converting-", dir=out_dir.parent))
    try:
        done = _write(
            inputs,
            stage,
            delimiter,
            lists,
            separator,
            rows_per_file,
            row_group_size,
            block_bytes,
            compression,
            required,
        )
        _publish_dir(stage, out_dir)
    except OSError as e:
        if e.errno == errno.ENOSPC or "No space left" in str(e):
            need = sum(os.path.getsize(p) for p in inputs)
            raise ConvertError(
                f"no space left on the device of {out_dir.parent} while writing the Parquet files: about "
                f"{need / 1e6:,.0f} MB may be needed (the text's size; Parquet is usually smaller); free space "
                "or choose another --out"
            ) from None
        raise ConvertError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    done["files"] = [str(out_dir / Path(f).name) for f in done["files"]]
    return done


def _publish_dir(stage: Path, out_dir: Path) -> None:
    """Make the finished directory `stage` the directory `out_dir` (absent or empty) in one rename,
    with the permissions a new directory gets (the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(stage, 0o777 & ~mask)
    for f in stage.iterdir():
        os.chmod(f, 0o666 & ~mask)
    publish_dir(stage, out_dir)  # out_dir absent or empty: checked before


# long: one streaming pass over the CSV, read top to bottom
def _write(
    inputs: Sequence[str],
    out_dir: Path,
    delimiter: str,
    lists: dict[str, bool],
    separator: str,
    rows_per_file: int,
    row_group_size: int,
    block_bytes: int,
    compression: str,
    required: bool,
) -> dict:
    """Write the inputs as part-NNNNN.parquet files in `out_dir`; returns {"files", "rows", "schema"}."""
    files: list[str] = []
    rows = 0
    types: dict[str, pa.DataType] | None = None
    schema: pa.Schema | None = None
    writer: pq.ParquetWriter | None = None
    in_file = 0
    progress = Progress("convert", sum(os.path.getsize(p) for p in inputs))
    read_bytes = 0

    def finish() -> None:
        nonlocal writer, in_file
        if writer is not None:
            writer.close()
            files.append(str(out_dir / f"part-{len(files):05d}.parquet"))
        writer, in_file = None, 0

    try:
        for path in inputs:
            size, seen = os.path.getsize(path), 0
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
                        target = out_dir / f"part-{len(files):05d}.parquet"
                        writer = pq.ParquetWriter(str(target), schema, **write_options(schema, compression))
                    n = min(table.num_rows - start, rows_per_file - in_file)
                    writer.write_table(table.slice(start, n), row_group_size=row_group_size)
                    start, in_file, rows = start + n, in_file + n, rows + n
                    if in_file == rows_per_file:
                        finish()
                seen = min(size, seen + block_bytes)
                progress.update(read_bytes + seen, rows)
            read_bytes += size
        finish()
    finally:
        if writer is not None:
            writer.close()
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
