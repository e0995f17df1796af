"""The scorer's Parquet input: every row of a file, directory, glob or URI, in file order, read by the
training reader with the columns the export recorded (dense, sparse, labels, id_policy, multi_hot_sizes).

Label columns are optional: all present gives labels [N] (one task) or [N, T]; none present gives
none. With labels, the recorded sample-weight column, where the files have it, weights the metrics.
Columns the model reads that the files lack, and some but not all label columns, are one-line errors
naming the file and the column.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from dlrm.common.errors import UserError
from dlrm.config import ModelConfig, ParquetConfig
from dlrm.config.choices import SparseKind
from dlrm.data.parquet.files import ParquetDataError, list_files
from dlrm.data.parquet.schema import type_problem
from dlrm.data.parquet.source import ParquetSource
from dlrm.data.source import RAW_ID_BOUND
from dlrm.export import ExportedData

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

_GLOB = set("*?[")


def is_parquet(data: str) -> bool:
    """Whether --data names Parquet: a URI, a glob, a file that starts with Parquet's magic bytes, or a
    directory without a Criteo manifest.json that holds *.parquet files."""
    if "://" in data or (_GLOB & set(data) and not os.path.exists(data)):
        return True
    if os.path.isfile(data):
        with open(data, "rb") as f:
            return f.read(4) == b"PAR1"
    if os.path.isdir(data):
        if os.path.exists(os.path.join(data, "manifest.json")):
            return False
        return any(name.endswith(".parquet") for _, _, names in os.walk(data) for name in names)
    return False


def check_source(a: argparse.Namespace, exported: ExportedData, parquet: bool) -> None:
    """Refuse Parquet --data for a model trained on Criteo-shaped data, the reverse, and Criteo's flags
    with Parquet (`a`: the scorer's parsed arguments).

    Raises:
        UserError: the data and the model's training data disagree, or a Criteo flag is given with Parquet.
    """
    model, data = a.model, a.data
    flags = {
        "--days": a.days,
        "--eval-fraction": a.eval_fraction,
        "--multi-hot-sizes": a.multi_hot_sizes,
        "--no-checksums": a.no_checksums,
        "--options-from": a.options_from,
        "--table-sizes": a.table_sizes,
        "--policy": a.policy,
    }
    criteo_flags = [f for f, v in flags.items() if v]
    if exported.source == "parquet" and not parquet:
        assert exported.parquet is not None
        raise UserError(
            f"{model} was trained on Parquet data (columns {sorted(input_columns(exported.parquet))}) but --data "
            f"{data} is not Parquet; give Parquet files (a file, a directory or a glob) with those columns"
        )
    if parquet and exported.source != "parquet":
        trained = f"data.source={exported.source}" if exported.source else "Criteo-shaped data (no Parquet columns)"
        raise UserError(
            f"--data {data} is Parquet but {model} was trained on {trained}; score it with a preprocessed "
            "Criteo directory or a Criteo TSV, or export a model trained with data.source=parquet"
        )
    if parquet and criteo_flags:
        raise UserError(
            f"{', '.join(criteo_flags)}: for Criteo data; Parquet rows are scored in file order "
            "(--max-rows: the first N)"
        )


def input_columns(columns: ParquetConfig) -> dict[str, tuple[str, str]]:
    """{column: (its kind as the reader checks it, what the model reads it as)} of the recorded
    data.parquet, labels left out."""
    found = {c: ("dense", "a dense feature") for c in columns.dense}
    for s in columns.sparse:
        is_list = s.kind in (SparseKind.ids, SparseKind.strings)
        found[s.column or s.name] = (str(s.kind), f"sparse feature {s.name!r}, kind {s.kind}")
        if s.weights:
            found[s.weights] = ("weights" if is_list else "weight", f"the weights of {s.name!r}")
    return found


def _first_schema(data: str) -> pa.Schema:
    """The schema of the first file of `data` (--data); refuses an unreadable one."""
    fs, paths = list_files(data, "--data")
    try:
        with fs.open_input_file(paths[0]) as f:
            return pq.read_schema(f)
    except (pa.ArrowException, OSError) as e:
        raise ParquetDataError(
            f"{paths[0]} is not a readable Parquet file ({str(e).splitlines()[0]}); rewrite or remove it"
        ) from None


def present_labels(data: str, columns: ParquetConfig) -> list[str]:
    """The label columns to read: all of them, or [] when the files have none (unlabeled rows);
    refuses a first file that lacks a column the model reads or holds it as another type, or has
    some labels but not all (the reader checks every file's schema against the first's)."""
    _, paths = list_files(data, "--data")
    schema = _first_schema(data)
    names = set(schema.names)
    for column, (kind, role) in input_columns(columns).items():
        if column not in names:
            raise ParquetDataError(
                f"{paths[0]} has no column {column!r} ({role}), which the model was trained on; score files "
                f"with its columns: {sorted(input_columns(columns))}"
            )
        if type_problem(schema.field(column).type, kind):
            raise ParquetDataError(
                f"column {column!r} of {paths[0]} is {schema.field(column).type}, but the model reads it as {role}; "
                "write it as the training data had it"
            )
    have = [c for c in columns.labels if c in names]
    if have and len(have) < len(columns.labels):
        lacking = [c for c in columns.labels if c not in names]
        raise ParquetDataError(
            f"{paths[0]} has label column(s) {have} but not {lacking}; give all the model's label columns "
            f"{list(columns.labels)} (to evaluate) or none (to score only)"
        )
    return have


def parquet_batches(
    data: str,
    columns: ParquetConfig,
    cfg: ModelConfig,
    batch_size: int,
    max_rows: int | None,
    counts: dict,
    raw_dense: bool = False,
) -> Iterator[Batch]:
    """Batches of every row of `data` in file order.

    Args:
        data: a Parquet file, directory, glob or URI.
        columns: the recorded data.parquet columns.
        max_rows: keep the first max_rows rows if given.
        counts: receives counts['labeled'], 1 when the files have the label columns, else 0.
        raw_dense: dense values as read (NaN where missing), for a program that transforms them.

    Raises:
        UserError: a column the model reads is missing, or some label columns but not all are present.
    """
    labels = present_labels(data, columns)
    counts["labeled"] = int(bool(labels))
    weight = columns.weight if labels and columns.weight in _first_schema(data).names else None
    recorded = replace(
        columns, path=data, labels=labels, weight=weight, eval_path=None, eval_fraction=0.0, shuffle=False
    )
    names = [f for t in cfg.tables for f in t.features]
    rows = [RAW_ID_BOUND if t.vocabulary.managed else int(t.rows) for t in cfg.tables for _ in t.features]
    try:
        source = ParquetSource(recorded, names, rows, global_batch_size=1, seed=0, raw_dense=raw_dense)
    except UserError as e:
        raise UserError(f"--data {data} does not fit the model's recorded data.parquet: {_for_scoring(e)}") from None
    return _checked(source.rows_in_order(batch_size, max_rows))


_SETTING = re.compile(r"(,? or)? set data\.parquet\.(\w+)=(\w+)( to [^;,]*)?")


def _for_scoring(error: UserError) -> str:
    """The reader's message with its training-time fixes (`set data.parquet.KEY=VALUE`) replaced by
    what the scorer can do: the export holds those settings."""
    return _SETTING.sub(
        lambda m: f"; the model was exported with data.parquet.{m.group(2)} != {m.group(3)}, so fix the rows",
        str(error),
    )


def _checked(batches: Iterator[Batch]) -> Iterator[Batch]:
    """`batches`, a bad value's error worded for the scorer (`_for_scoring`)."""
    try:
        yield from batches
    except UserError as e:
        raise UserError(_for_scoring(e)) from None
