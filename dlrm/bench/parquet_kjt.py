"""The Parquet source's KeyedJaggedTensor batches against a bare pyarrow loop over the same file.

    python -m dlrm.bench.parquet_kjt --rows 40000 --rounds 3

Writes a file of `--features` list<int64> columns (Poisson(`--mean-ids`) ids per sample), a dense and
a label column, in row groups of --batch rows; then, in interleaved rounds, one pass of
`ParquetSource.batches("eval", 0, 1)` (the checks, KJT and Batch, on its reader thread) and one of
`ParquetFile.iter_batches` with numpy offsets/values per column and nothing else. Prints ids/s
(wall clock) and ids per CPU-second (the process's CPU time: moves far less when other jobs take
the cores) of each round, and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm.config import ParquetConfig, SparseColumnConfig
from dlrm.config.choices import SparseKind
from dlrm.data.parquet.source import ParquetSource


def write(path: Path, rows: int, features: int, mean_ids: float, row_group: int) -> list[str]:
    """Write the benchmark file: a dense, a label and `features` list<int64> columns; returns the latter's names."""
    rng = np.random.default_rng(0)
    columns: dict[str, object] = {"d0": rng.random(rows), "label": rng.integers(0, 2, rows)}
    for f in range(features):
        lengths = rng.poisson(mean_ids, rows)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        columns[f"f{f}"] = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1_000_000, int(lengths.sum()))))
    pq.write_table(pa.table(columns), path, row_group_size=row_group)
    return [f"f{f}" for f in range(features)]


def source_pass(source: ParquetSource) -> int:
    """Ids in one pass of the source's eval batches."""
    return sum(b.sparse_features.values().numel() for b in source.batches("eval", 0, 1))


def bare_pass(path: Path, names: list[str], batch: int) -> int:
    """Ids in one pass of `iter_batches` turned into numpy lengths and values per column."""
    ids = 0
    for rb in pq.ParquetFile(path).iter_batches(batch_size=batch, columns=[*names, "d0", "label"]):
        lengths, values = [], []
        for name in names:
            a = rb.column(name)
            offsets = a.offsets.to_numpy()
            lengths.append(np.diff(offsets))
            values.append(a.values.to_numpy()[offsets[0] : offsets[-1]])
        ids += np.concatenate(values).size
        _ = np.concatenate(lengths), rb.column("d0").to_numpy(), rb.column("label").to_numpy()  # as a batch would
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--features", type=int, default=26)
    ap.add_argument("--mean-ids", type=float, default=20.0)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.parquet"
        names = write(path, a.rows, a.features, a.mean_ids, a.batch)
        sparse = [SparseColumnConfig(name=n, kind=SparseKind.ids) for n in names]
        cfg = ParquetConfig(path=str(path), eval_path=str(path), dense=["d0"], sparse=sparse)
        source = ParquetSource(cfg, names, [1_000_000] * a.features, a.batch, 0)
        source_pass(source)  # warm-up: imports, first reads
        results: dict[str, list[tuple[float, float]]] = {"ParquetSource KJT": [], "bare iter_batches + numpy": []}
        for r in range(a.rounds):
            for name, run in (
                ("ParquetSource KJT", lambda: source_pass(source)),
                ("bare iter_batches + numpy", lambda: bare_pass(path, names, a.batch)),
            ):
                wall, cpu = time.perf_counter(), time.process_time()
                ids = run()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                results[name].append((ids / wall, ids / cpu))
                print(f"round {r}: {name}: {ids / wall / 1e6:.2f} M ids/s, {ids / cpu / 1e6:.2f} M ids per CPU-second")
        for name, rounds in results.items():
            wall = statistics.median(w for w, _ in rounds)
            cpu = statistics.median(c for _, c in rounds)
            print(f"median: {name}: {wall / 1e6:.2f} M ids/s, {cpu / 1e6:.2f} M ids per CPU-second")


if __name__ == "__main__":
    main()
