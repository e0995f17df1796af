"""Look at a Parquet dataset and write a Hydra config directory that trains on it.

    python -m dlrm.data.inspect data/clicks --out myconf --label clicked
    python -m dlrm.train -cd myconf model=mydata data=mydata

Reads the first `--sample-rows` rows (in file order) and prints per column: its type, the share of
missing values (nulls, and empty lists), the distinct values in the sample, and for list columns the
mean and max values per sample. Each column gets a role: the --label columns are labels; float
columns (and --dense ones) dense features; integer columns one id per sample (kind id), list<int>
columns several (kind ids), string and list<string> columns hashed (kind string, strings); --ignore
drops a column. Per sparse feature it suggests the table rows (integer ids: the largest id in the
sample + 1, at least 2x the distinct ids seen scaled to the dataset's rows, below which `id_policy:
modulo` would fold ids; hashed strings: 2x the distinct strings scaled likewise; capped by
--max-rows) and the pooling factor (mean ids per sample, to 2 decimals: what the planner and the
cost model take). It writes DIR/model/NAME.yaml and
DIR/data/NAME.yaml (--name, default mydata): config group options that `python -m dlrm.train -cd DIR
model=NAME data=NAME` (Hydra's --config-dir adds DIR to the search path) takes as they are.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from omegaconf import OmegaConf

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import write_atomic
from dlrm.data.parquet.files import ParquetDataError, compute, list_files


@dataclass
class Column:
    """What the sample says of one column; role: label, dense, id, ids, string, strings or ignore."""

    name: str
    type: str
    role: str
    missing: float
    distinct: int
    mean_per_sample: float = 1.0
    max_per_sample: int = 1
    max_id: int | None = None
    rows: int | None = None  # suggested table rows (sparse roles)
    pooling: float | None = None  # the pooling factor: mean ids per sample (sparse roles)


def _role(t: pa.DataType, name: str, labels: Sequence[str], dense: Sequence[str], ignore: Sequence[str]) -> str:
    if name in ignore:
        return "ignore"
    if name in labels:
        return "label"
    if name in dense or pa.types.is_floating(t):
        return "dense"
    if pa.types.is_integer(t):
        return "id"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_integer(t.value_type):
            return "ids"
        if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type):
            return "strings"
    return "ignore"


def sample(path: str, rows: int) -> tuple[pa.Table, int, int]:
    """The first `rows` rows of the dataset at `path` (file order), the dataset's rows and row groups."""
    fs, paths = list_files(path, "PATH")
    parts, total, taken, groups = [], 0, 0, 0
    for p in paths:
        try:
            with fs.open_input_file(p) as f:
                parquet = pq.ParquetFile(f)
                total += parquet.metadata.num_rows
                groups += parquet.metadata.num_row_groups
                for batch in parquet.iter_batches(batch_size=min(65536, max(1, rows))):
                    if taken >= rows:
                        break
                    batch = batch.slice(0, rows - taken)
                    parts.append(batch)
                    taken += batch.num_rows
        except (pa.ArrowException, OSError) as e:
            raise ParquetDataError(f"{p} is not a readable Parquet file ({str(e).splitlines()[0]})") from None
    if not taken:
        raise ParquetDataError(f"{path} holds no rows")
    schemas = {str(b.schema) for b in parts}
    if len(schemas) > 1:
        raise ParquetDataError(f"the files of {path} have different schemas; rewrite them with one schema")
    return pa.Table.from_batches(parts), total, groups


def describe(
    table: pa.Table,
    total_rows: int,
    labels: Sequence[str],
    dense: Sequence[str] = (),
    ignore: Sequence[str] = (),
    max_rows: int = 10_000_000,
) -> list[Column]:
    """One `Column` per column of the sample `table`, with suggestions for the sparse ones."""
    n = table.num_rows
    scale = max(1.0, total_rows / n)
    out = []
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        role = _role(col.type, name, labels, dense, ignore)
        c = Column(name, str(col.type), role, col.null_count / n, 0)
        values = col
        if role in ("ids", "strings"):
            lengths = pc.fill_null(compute("list_value_length", col), 0).to_numpy(zero_copy_only=False)
            c.missing = float((lengths == 0).mean())
            c.mean_per_sample, c.max_per_sample = float(lengths.mean()), int(lengths.max(initial=0))
            values = compute("list_flatten", col)
        if role != "ignore" or not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            c.distinct = int(compute("count_distinct", values).as_py())
        if role in ("id", "ids", "string", "strings"):
            seen = min(max_rows, max(16, math.ceil(2 * c.distinct * scale)))
            if role in ("id", "ids"):
                top = compute("max", values).as_py()
                c.max_id = None if top is None else int(top)
                seen = max(seen, (c.max_id or 0) + 1) if (c.max_id or 0) < max_rows else max_rows
            c.rows = int(seen)
            c.pooling = max(0.01, round(c.mean_per_sample, 2))  # positive: a feature always empty counts 0.01
        out.append(c)
    return out


def configs(
    columns: list[Column], path: str, batch_size: int, dim: int, total_rows: int, row_groups: int
) -> tuple[dict, dict]:
    """The model and data config group options for these columns: (model, data) as plain dicts. The
    eval split is the last tenth of the row groups (at least one; none if there is only one)."""
    sparse = [c for c in columns if c.role in ("id", "ids", "string", "strings")]
    dense = [c.name for c in columns if c.role == "dense"]
    labels = [c.name for c in columns if c.role == "label"]
    if not labels:
        raise ParquetDataError("no label column: name the 0/1 label column(s) with --label COL")
    if not sparse:
        raise ParquetDataError("no sparse column (integer, list<int>, string): DLRM needs at least one")
    batch = batch_size
    while batch > 1 and batch * 4 > total_rows:  # leave a few train batches (and an eval one) on a small dataset
        batch //= 2
    model = {
        # no dense column: no bottom MLP; dot needs two features to multiply, else the cross net
        "interaction": "dot" if dense or len(sparse) > 1 else "dcn",
        "dense_in_features": len(dense),
        "bottom_mlp": [64, dim] if dense else [],
        "top_mlp": [64, 32, len(labels)],
        "tasks": [{"name": label, "weight": 1.0} for label in labels],  # one logit per label column
        "tables": [
            {"name": f"t_{c.name}", "rows": c.rows, "dim": dim, "features": [c.name], "pooling": c.pooling}
            for c in sparse
        ],
    }
    data = {
        "source": "parquet",
        "global_batch_size": batch,
        "eval_batches": 16 if row_groups > 1 else 0,
        "parquet": {
            "path": path if "://" in path else os.path.abspath(path),
            "dense": dense,
            "sparse": [{"name": c.name, "column": c.name, "kind": c.role} for c in sparse],
            "labels": labels,
            "eval_fraction": max(0.1, 1 / row_groups) if row_groups > 1 else 0.0,
            "id_policy": "modulo"
            if any(c.max_id is not None and c.max_id >= (c.rows or 0) for c in sparse)
            else "refuse",
        },
    }
    return model, data


def write_configs(out: str, name: str, model: dict, data: dict, source: str) -> list[Path]:
    """Write DIR/model/NAME.yaml and DIR/data/NAME.yaml (atomically); returns their paths."""
    written = []
    for group, body in (("model", model), ("data", data)):
        path = Path(out) / group / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        head = f"# {group} for {source}, written by python -m dlrm.data.inspect; edit freely.\n"
        write_atomic(path, (head + OmegaConf.to_yaml(OmegaConf.create(body))).encode())
        written.append(path)
    return written


def _table(columns: list[Column]) -> str:
    lines = [
        f"{'column':<20} {'type':<22} {'role':<8} {'missing':>8} {'distinct':>9} {'ids/sample':>14} {'rows':>9} pool"
    ]
    for c in columns:
        per = f"{c.mean_per_sample:.2f}/{c.max_per_sample}" if c.role in ("ids", "strings") else ""
        lines.append(
            f"{c.name:<20} {c.type[:22]:<22} {c.role:<8} {c.missing:>8.1%} {c.distinct:>9} {per:>14} "
            f"{c.rows if c.rows else '':>9} {c.pooling or ''}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.data.inspect", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("path", help="the Parquet files: a directory, a glob or a URI")
    ap.add_argument("--out", required=True, help="the config directory to write (DIR/model, DIR/data)")
    ap.add_argument("--name", default="mydata", help="the config options' name (model=NAME data=NAME)")
    ap.add_argument("--label", action="append", default=[], help="a 0/1 label column (repeat; default: 'label')")
    ap.add_argument("--dense", action="append", default=[], help="an integer column to use as a dense feature")
    ap.add_argument("--ignore", action="append", default=[], help="a column to leave out")
    ap.add_argument("--sample-rows", type=int, default=100_000, help="rows read")
    ap.add_argument("--batch-size", type=int, default=512, help="global batch size (halved on a small dataset)")
    ap.add_argument("--dim", type=int, default=16, help="embedding dimension (a multiple of 4)")
    ap.add_argument("--max-rows", type=int, default=10_000_000, help="the largest table suggested")
    try:
        a = ap.parse_args(argv)
        if a.sample_rows < 1 or a.batch_size < 1 or a.dim < 4 or a.dim % 4 or a.max_rows < 16:
            raise UserError("--sample-rows and --batch-size >= 1, --dim a multiple of 4, --max-rows >= 16")
        if not a.name.isidentifier():
            raise UserError(f"--name {a.name!r}: use letters, digits and underscores")
        table, total, groups = sample(a.path, a.sample_rows)
        labels = a.label or (["label"] if "label" in table.column_names else [])
        missing = [c for c in [*labels, *a.dense, *a.ignore] if c not in table.column_names]
        if missing:
            raise UserError(f"column(s) {missing} are not in {a.path}; its columns are {table.column_names}")
        columns = describe(table, total, labels, a.dense, a.ignore, a.max_rows)
        print(f"{a.path}: {total:,} rows; sample of {table.num_rows:,}")
        print(_table(columns))
        model, data = configs(columns, a.path, a.batch_size, a.dim, total, groups)
        written = write_configs(a.out, a.name, model, data, a.path)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {', '.join(map(str, written))}")
    if groups == 1:
        print(
            "note: one row group, so no eval split: convert with a smaller --row-group-size, or set "
            "data.parquet.eval_path"
        )
    print(f"train with: python -m dlrm.train -cd {a.out} model={a.name} data={a.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
