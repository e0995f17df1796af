"""A small Parquet dataset of every column kind `data.source=parquet` reads, and the overrides that
train the matching model on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS, FILES, ROW_GROUP = 960, 2, 40
TABLES = {"user": 100, "items": 50, "city": 64}  # feature -> table rows


def table(rows: int = ROWS, seed: int = 0, first: int = 0) -> pa.Table:
    """Rows `first`.. of the dataset: pos (= row / ROWS, a dense feature that names the row), x,
    user (an id), items (0..5 ids, weights items_w), city (a string), label, label2, w (a sample
    weight: 0, 1, 2 or 3)."""
    rng = np.random.default_rng([seed, first])
    lengths = rng.integers(0, 6, rows)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    n = int(lengths.sum())
    return pa.table(
        {
            "pos": (np.arange(first, first + rows) / ROWS).astype(np.float64),
            "x": rng.normal(size=rows).astype(np.float32),
            "user": rng.integers(0, TABLES["user"], rows),
            "items": pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, TABLES["items"], n))),
            "items_w": pa.ListArray.from_arrays(offsets, pa.array(rng.random(n).astype(np.float32))),
            "city": pa.array([f"city-{k}" for k in rng.integers(0, 30, rows)]),
            "label": rng.integers(0, 2, rows),
            "label2": rng.integers(0, 2, rows).astype(np.int8),
            "w": rng.integers(0, 4, rows).astype(np.float32),
        }
    )


def write_dataset(out: str | Path, rows: int = ROWS, files: int = FILES, row_group: int = ROW_GROUP) -> list[Path]:
    """`files` files of rows/files rows each in `out` (part-0.parquet, ...); returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per = rows // files
    paths = []
    for f in range(files):
        path = out / f"part-{f}.parquet"
        pq.write_table(table(per, first=f * per), path, row_group_size=row_group)
        paths.append(path)
    return paths


def overrides(path: str | Path) -> tuple[str, ...]:
    """data.source=parquet on `path`, and a model whose tables serve user, items (jagged) and city (hashed)."""
    tables = ",".join(
        f"{{name:t_{f},rows:{r},dim:8,features:[{f}]{',pooling:3' if f == 'items' else ''}}}" for f, r in TABLES.items()
    )
    return (
        "model.dense_in_features=2",
        f"model.tables=[{tables}]",
        "data.source=parquet",
        f"data.parquet.path={path}",
        "data.parquet.dense=[pos,x]",
        "data.parquet.sparse=[{name:user,kind:id},{name:items,kind:ids},{name:city,kind:string}]",
        "data.parquet.labels=[label]",
        "data.parquet.eval_fraction=0.2",
    )


def two_task_overrides(train_dir: str | Path, eval_dir: str | Path, batch: int, eval_rows: int) -> tuple[str, ...]:
    """`overrides(train_dir)` made a weighted two-task model (labels label, label2; items weighted by
    items_w) scored on the Parquet files of `eval_dir`, `eval_rows` rows in batches of `batch`."""
    return (
        *overrides(train_dir),
        "model.bottom_mlp=[16,8]",
        "model.top_mlp=[16,2]",
        "model.tasks=[{name:click},{name:convert}]",
        "model.weighted=true",
        "data.parquet.sparse=[{name:user,kind:id},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]",
        "data.parquet.labels=[label,label2]",
        "data.parquet.eval_fraction=0",
        f"data.parquet.eval_path={eval_dir}",
        f"data.global_batch_size={batch}",
        f"data.eval_batches={eval_rows // batch}",
    )
