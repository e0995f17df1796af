"""`python -m dlrm.data.inspect PATH --out DIR --label COL`: profile a Parquet dataset and write the
Hydra config group options DIR/model/NAME.yaml and DIR/data/NAME.yaml that train on it.

Reads about `--sample-rows` rows as whole row groups spread over every file, decides each column's
role and settings, prints them, and writes the
configs: dense transforms with one comment per column, tables sized from the expected distinct ids,
safe feature names, an eval split of at least one global batch. An existing config is refused
unless --force, which keeps the old one as NAME.yaml.bak.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import write_atomic
from dlrm.data.inspect.columns import SPARSE, Column, describe
from dlrm.data.inspect.sample import sample
from dlrm.data.parquet.files import ParquetDataError
from dlrm.data.source import RAW_ID_BOUND


def safe_name(column: str, taken: set[str]) -> str:
    """A feature name from a column name: letters, digits and underscores (a dot or a space would be
    read as a config path or module name), not starting with a digit, unique among `taken`."""
    base = re.sub(r"\W", "_", column, flags=re.ASCII) or "col"
    if base[0].isdigit():
        base = f"c_{base}"
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def vocabulary(column: Column, policy: str) -> dict | None:
    """The managed vocabulary of a sparse column with --vocabulary POLICY: {"rows", "vocabulary",
    "reason"} for strings and sparse id spaces (`suggest_vocabulary`), else None (ids index or fold
    into the table)."""
    if policy == "none":
        return None
    from dlrm.models.vocabulary import suggest_vocabulary

    suggested = suggest_vocabulary(max(column.estimate, column.distinct), column.max_id, column.role)
    if suggested is not None:
        suggested["vocabulary"] = {"policy": policy}
    return suggested


def eval_split(total_rows: int, row_groups: int, batch: int) -> tuple[float, int, str]:
    """The eval split: the last tenth of the row groups, or more to hold one global batch of `batch`
    rows, while the train split keeps one.

    Returns:
        (data.parquet.eval_fraction, data.eval_batches, why there is none or ""); (0.0, 0, why) when
        the rows cannot hold both splits.
    """
    if row_groups < 2:
        return 0.0, 0, "one row group: convert with a smaller --row-group-size, or set data.parquet.eval_path"
    per_group = total_rows / row_groups
    held = max(math.ceil(0.1 * row_groups), math.ceil(batch / per_group))
    if held >= row_groups or total_rows - held * per_group < batch:
        return (
            0.0,
            0,
            (
                f"{total_rows:,} rows cannot hold a train split and an eval split of one global batch ({batch}) each: "
                "lower --batch-size or set data.parquet.eval_path"
            ),
        )
    eval_rows = held * per_group
    return held / row_groups, max(1, min(16, int(eval_rows // batch))), ""


def configs(
    columns: list[Column],
    path: str,
    batch_size: int,
    dim: int,
    total_rows: int,
    row_groups: int,
    vocabulary_policy: str = "none",
) -> tuple[dict, dict, str]:
    """The model and data config group options that train on these columns, as plain dicts.

    Args:
        columns: the columns as `describe` decided them.
        path: the dataset (data.parquet.path).
        batch_size: the global batch size.
        dim: the tables' embedding dim.
        total_rows: the dataset's rows; row_groups: its row groups (the eval split).
        vocabulary_policy: none, or lru / lfu for managed vocabularies of strings and sparse id spaces.

    Returns:
        (model, data, why there is no eval split or "").

    Raises:
        ParquetDataError: no label column, or no sparse column.
    """
    sparse = [c for c in columns if c.role in SPARSE]
    dense = [c for c in columns if c.role == "dense"]
    labels = [c.name for c in columns if c.role == "label"]
    weights = [c.name for c in columns if c.role == "weight"]
    if not labels:
        raise ParquetDataError("no label column: name the 0/1 label column(s) with --label COL")
    if not sparse:
        raise ParquetDataError("no sparse column (integer, list<int>, string) left: DLRM needs at least one")
    batch = batch_size
    while batch > 1 and batch * 4 > total_rows:  # leave a few train batches (and an eval one) on a small dataset
        batch //= 2
    taken: set[str] = set()
    names = {c.name: safe_name(c.name, taken) for c in sparse}
    flags = sum(1 for c in dense if c.transform and c.transform["missing_flag"])
    tables, managed = _tables(sparse, names, dim, vocabulary_policy)
    model = {
        # no dense column: no bottom MLP; dot needs two features to multiply, else the cross net
        "interaction": "dot" if dense or len(sparse) > 1 else "dcn",
        "dense_in_features": len(dense) + flags,
        "bottom_mlp": [64, dim] if dense else [],
        "top_mlp": [64, 32, len(labels)],
        "tasks": [{"name": label, "weight": 1.0} for label in labels],  # one logit per label column
        "tables": tables,
    }
    fraction, eval_batches, why = eval_split(total_rows, row_groups, batch)
    bound = {c.name: RAW_ID_BOUND if c.name in managed else (c.rows or 0) for c in sparse}  # uint64: folded
    folds = any(c.max_id is not None and (c.max_id >= bound[c.name] or (c.min_id or 0) < 0) for c in sparse)
    data = {
        "source": "parquet",
        "global_batch_size": batch,
        "eval_batches": eval_batches,
        "parquet": {
            "path": path if "://" in path else os.path.abspath(path),
            "dense": [c.name for c in dense],
            "sparse": [
                {"name": names[c.name], "kind": c.role, **({"column": c.name} if names[c.name] != c.name else {})}
                for c in sparse
            ],
            "labels": labels,
            **({"weight": weights[0]} if weights else {}),  # --weight: the loss and the metrics' weights
            "eval_fraction": fraction,
            "id_policy": "modulo" if folds else "refuse",
        },
    }
    return model, data, why


def _tables(sparse: list[Column], names: dict[str, str], dim: int, policy: str) -> tuple[list[dict], set[str]]:
    """(model.tables entries, the columns given a managed vocabulary) of the sparse columns."""
    tables, managed = [], set()
    for c in sparse:
        table = {
            "name": f"t_{names[c.name]}",
            "rows": c.rows,
            "dim": dim,
            "features": [names[c.name]],
            "pooling": c.pooling,
        }
        vocab = vocabulary(c, policy)
        if vocab is not None:
            table["rows"], table["vocabulary"] = vocab["rows"], vocab["vocabulary"]
            managed.add(c.name)
            c.notices.append(f"{c.name!r}: a managed vocabulary of {vocab['rows']:,} rows ({vocab['reason']})")
        tables.append(table)
    return tables, managed


def _transforms_yaml(dense: list[Column]) -> str:
    """data.parquet.dense_transforms as YAML lines under `parquet:`, one comment per column."""
    if not dense:
        return ""
    lines = ["  dense_transforms:"]
    for c in dense:
        assert c.transform is not None
        lines.append(f"    # {c.name}: {c.explain}")
        lines.append(f"    {json.dumps(c.name)}: {json.dumps(c.transform)}")
    return "\n".join(lines) + "\n"


def write_configs(
    out: str, name: str, model: dict, data: dict, source: str, dense: Sequence[Column] = (), force: bool = False
) -> list[Path]:
    """Write `out`/model/`name`.yaml and `out`/data/`name`.yaml atomically; returns their paths.

    `source` names the dataset in each file's first comment; `dense` columns get one comment each on
    their transform in the data file.

    Raises:
        UserError: a config exists and not `force` (with `force` it is kept as NAME.yaml.bak first).
    """
    paths = {group: Path(out) / group / f"{name}.yaml" for group in ("model", "data")}
    existing = [p for p in paths.values() if p.exists()]
    if existing and not force:
        raise UserError(
            f"{existing[0]} exists (and may hold your edits): give --force to replace it (the old file is kept as "
            f"{existing[0].name}.bak), or another --out or --name"
        )
    written = []
    for group, body in (("model", model), ("data", data)):
        path = paths[group]
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            shutil.copy2(path, path.with_name(path.name + ".bak"))
        head = f"# {group} for {source}, written by python -m dlrm.data.inspect; edit freely.\n"
        text = head + OmegaConf.to_yaml(OmegaConf.create(body))
        if group == "data":
            text += _transforms_yaml(list(dense))
        write_atomic(path, text.encode())
        written.append(path)
    return written


def _table(columns: list[Column]) -> str:
    lines = [
        f"{'column':<20} {'type':<16} {'role':<8} {'missing':>8} {'distinct':>9} {'ids/sample':>10} {'rows':>9} "
        f"{'modulo':>7}  decision"
    ]
    for c in columns:
        per = f"{c.mean_per_sample:.2f}/{c.max_per_sample}" if c.role in ("ids", "strings") else ""
        collide = f"{c.collisions:.0%}" if c.role in SPARSE else ""
        what = c.reason or c.explain
        if c.role in SPARSE:
            what = f"~{c.estimate:,} distinct expected" + (f"; {c.reason}" if c.reason else "")
        lines.append(
            f"{c.name[:20]:<20} {c.type[:16]:<16} {c.role:<8} {c.missing:>8.1%} {c.distinct:>9} {per:>10} "
            f"{c.rows if c.rows else '':>9} {collide:>7}  {what}"
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
    ap.add_argument("--keep", action="append", default=[], help="a column to keep that inspect would leave out")
    ap.add_argument("--weight", default="", help="a sample-weight column: not a feature")
    ap.add_argument("--force", action="store_true", help="replace an existing config (kept as NAME.yaml.bak)")
    ap.add_argument("--sample-rows", type=int, default=100_000, help="rows read, spread over the dataset")
    ap.add_argument("--batch-size", type=int, default=512, help="global batch size (halved on a small dataset)")
    ap.add_argument("--dim", type=int, default=16, help="embedding dimension (a multiple of 4)")
    ap.add_argument("--max-rows", type=int, default=10_000_000, help="the largest table suggested")
    ap.add_argument(
        "--vocabulary",
        choices=("none", "lru", "lfu", "distance_lfu"),
        default="none",
        help="managed vocabularies (this eviction policy) for strings and sparse id spaces; none: modulo",
    )
    try:
        a = ap.parse_args(argv)
        if a.sample_rows < 1 or a.batch_size < 1 or a.dim < 4 or a.dim % 4 or a.max_rows < 16:
            raise UserError("--sample-rows and --batch-size >= 1, --dim a multiple of 4, --max-rows >= 16")
        if not a.name.isidentifier():
            raise UserError(f"--name {a.name!r}: use letters, digits and underscores")
        table, total, groups = sample(a.path, a.sample_rows)
        labels = a.label or (["label"] if "label" in table.column_names else [])
        named = [*labels, *a.dense, *a.ignore, *a.keep, *([a.weight] if a.weight else [])]
        missing = [c for c in named if c not in table.column_names]
        if missing:
            raise UserError(f"column(s) {missing} are not in {a.path}; its columns are {table.column_names}")
        both = sorted(set(labels) & set([*a.dense, *a.keep, a.weight]))
        if both:
            raise UserError(f"column(s) {both} named as a label and as an input or weight: a label is never an input")
        columns = describe(table, total, labels, a.dense, a.ignore, a.max_rows, a.keep, a.weight)
        print(f"{a.path}: {total:,} rows in {groups:,} row groups; sample of {table.num_rows:,} rows spread over them")
        print(_table(columns))
        model, data, no_eval = configs(columns, a.path, a.batch_size, a.dim, total, groups, a.vocabulary)
        dense = [c for c in columns if c.role == "dense"]
        written = write_configs(a.out, a.name, model, data, a.path, dense, a.force)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for c in columns:
        if c.role == "ignore" and c.reason and c.reason != "--ignore":
            print(f"left out {c.name!r}: {c.reason}")
        if c.role == "weight":
            print(
                f"note: {c.name!r} is a sample weight: not a feature; it weights the loss and the evaluation's "
                f"metrics (data.parquet.weight: {c.name})"
            )
        for line in c.notices:
            print(f"note: {line}")
    if no_eval:
        print(f"note: no eval split: {no_eval}")
    print(f"wrote {', '.join(map(str, written))}")
    print(f"train with: python -m dlrm.train -cd {a.out} model={a.name} data={a.name}")
    return 0
