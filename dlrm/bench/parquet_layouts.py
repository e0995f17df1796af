"""What decoding one row group of Criteo's one-hot shape costs in three Parquet layouts (pyarrow alone).

    python -m dlrm.bench.parquet_layouts [--rows 8192] [--groups 8] [--repeats 50]

Random rows of 13 float32 dense values, an int32 label and 26 int32 ids, every column REQUIRED and
PLAIN, per compression (snappy, none), the row group memory-mapped and read with `read_row_group`:
- columns: the source's layout, 40 columns, the 26 id columns copied into one [26, n] block;
- list: the ids as one fixed_size_list<int32>[26] column;
- binary: the ids as one fixed_size_binary(104) column;
each ending with the ids key-major, [26, n]; and `iter_batches` over every other row group against
`read_row_group` one by one, in the columns layout. Prints ms per row group (the best of 3 passes);
writes only in a temporary directory.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def tables(rows: int) -> dict[str, pa.Table]:
    """The same `rows` random rows in each layout: {"columns", "list", "binary": table}."""
    rng = np.random.default_rng(0)
    ids = (rng.random((rows, 26)) * 1e6).astype(np.int32)
    dense = rng.random((rows, 13)).astype(np.float32)
    label = pa.array((rng.random(rows) < 0.25).astype(np.int32))
    columns = [pa.array(dense[:, i]) for i in range(13)] + [label] + [pa.array(ids[:, i]) for i in range(26)]
    names = [f"d{i}" for i in range(13)] + ["label"] + [f"s{i}" for i in range(26)]
    required = [pa.field(n, c.type, nullable=False) for n, c in zip(names, columns, strict=True)]

    def one(values: pa.Array) -> pa.Table:
        schema = pa.schema([*required[:14], pa.field("ids", values.type, nullable=False)])
        return pa.Table.from_arrays([*columns[:14], values], schema=schema)

    flat = pa.array(ids.reshape(-1))
    packed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(104), rows, [None, pa.py_buffer(ids.tobytes())])
    return {
        "columns": pa.Table.from_arrays(columns, schema=pa.schema(required)),
        "list": one(pa.FixedSizeListArray.from_arrays(flat, 26)),
        "binary": one(packed),
    }


def ids_of(kind: str, group: pa.Table) -> np.ndarray:
    """The ids of a decoded row group key-major, [26, n] contiguous: the KeyedJaggedTensor's values."""
    if kind == "columns":  # as the source builds its block
        ids = np.empty((26, group.num_rows), np.int32)
        for i in range(26):
            ids[i] = group.column(f"s{i}").chunk(0).to_numpy()
        return ids
    column = group.column("ids").chunk(0)
    rows = column.values.to_numpy() if kind == "list" else np.frombuffer(column.buffers()[1], np.int32)
    return np.ascontiguousarray(rows.reshape(-1, 26).T)


def best_ms(run, count: int) -> float:
    """The best of 3 passes of `run()`, in ms per each of its `count` row groups."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) / count * 1e3)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192, help="rows per row group (one rank's batch)")
    ap.add_argument("--groups", type=int, default=8, help="row groups in the file")
    ap.add_argument("--repeats", type=int, default=50, help="row groups decoded per pass")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for compression in ("snappy", "none"):
            for kind, table in tables(args.rows * args.groups).items():
                path = Path(tmp) / f"{kind}_{compression}.parquet"
                pq.write_table(table, path, row_group_size=args.rows, use_dictionary=False, compression=compression)
                pf = pq.ParquetFile(pa.memory_map(str(path)))

                def decode(pf=pf, kind=kind) -> None:
                    for i in range(args.repeats):
                        ids_of(kind, pf.read_row_group(i % args.groups))

                ms = best_ms(decode, args.repeats)
                print(f"{compression:6s} {kind:8s} {ms:.3f} ms per row group ({path.stat().st_size // 1024} KiB file)")
            pf = pq.ParquetFile(pa.memory_map(str(Path(tmp) / f"columns_{compression}.parquet")))
            mine = list(range(0, args.groups, 2)) * max(1, args.repeats // max(1, args.groups // 2))

            def one_by_one(pf=pf, mine=mine) -> None:
                for g in mine:
                    pf.read_row_group(g)

            def streamed(pf=pf, mine=mine) -> None:
                for _ in pf.iter_batches(batch_size=args.rows, row_groups=mine, use_threads=False):
                    pass

            print(f"{compression:6s} columns, read_row_group {best_ms(one_by_one, len(mine)):.3f} ms, "
                  f"iter_batches {best_ms(streamed, len(mine)):.3f} ms per row group (no stacking)")  # fmt: skip


if __name__ == "__main__":
    main()
