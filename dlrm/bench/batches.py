"""Data-path benchmark: samples/s of each batch source at a training shape, in one process on the host.

    python -m dlrm.bench.batches [--sources synthetic,criteo,parquet] [--threads N] [--rows N]
                                      [--warmup N --window N --windows N] [--parquet-layout base|lists]
                                      [--row-group-rows N] [--reader-workers 1,2,4] [--out F]
                                      [hydra overrides]

The config is composed as for training (default `experiment=bench_dcnv2`). Each source is timed as
rank 0's slice of `--ranks` ranks against `--target` samples/s per process:
- synthetic: batches made on the CPU with `--threads` intra-op threads;
- criteo: one preprocessed day of `--rows` random rows in a temporary directory;
- parquet: the same rows as one Parquet file, `--parquet-layout` base (ids expanded by the source)
  or lists (expanded ids stored), once per `--reader-workers` count. `--rows` must exceed the
  reader's row-group cache, so that no window is served from it.
criteo and parquet read in file order, so they give the same batches. Prints one line per source
and writes the figures as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from dlrm.common.errors import ArgumentParser, UserError, exit_on_user_error
from dlrm.common.io import size_and_sha256, write_json_atomic
from dlrm.config import Config, CriteoConfig

TARGET_SAMPLES_PER_S = 3e6  # per GPU-feeding process: the data path's goal, above what one GPU trains
SOURCES = ("synthetic", "criteo", "parquet")


def write_random_day(directory: Path, rows: int, table_rows: list[int], seed: int = 0) -> Path:
    """Write day 0 of a preprocessed Criteo directory (arrays and manifest) of `rows` random rows.

    Dense values are log-normal-ish, ids of column c uniform in [0, table_rows[c]), labels 0/1.
    Returns `directory`.
    """
    from dlrm.data.criteo.format import NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, day_paths

    if len(table_rows) != NUM_SPARSE:
        raise UserError(f"the Criteo source needs {NUM_SPARSE} single-feature tables, the model has {len(table_rows)}")
    rng = np.random.default_rng(seed)
    dtype = np.int32 if max(table_rows) <= np.iinfo(np.int32).max else np.int64
    arrays = {
        "dense": np.log1p(rng.exponential(10.0, (rows, NUM_DENSE))).astype("<f4"),
        "sparse": (rng.random((rows, NUM_SPARSE)) * np.asarray(table_rows, np.float64)).astype(dtype),
        "labels": (rng.random((rows, 1)) < 0.25).astype("<i4"),
    }
    files = {}
    for kind, path in day_paths(str(directory), 0).items():
        np.save(path, arrays[kind])
        size, digest = size_and_sha256(path)
        files[kind] = {"bytes": size, "sha256": digest}
    manifest = {
        "format": "torchrec-binary-criteo",
        "days": [{"day": 0, "rows": rows, "skipped": 0, "files": files}],
        "sparse_dtype": np.dtype(dtype).name,
        "sparse_columns": SPARSE_NAMES,
        "table_sizes": list(table_rows),
        "note": "random rows written by dlrm.bench.batches",
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def write_parquet_day(
    day: Path, out: Path, pooling: list[int], table_rows: list[int], row_group_rows: int, lists: bool = False
) -> Path:
    """Write day 0 of the preprocessed directory `day` as `out/day_0.parquet` (REQUIRED columns).

    Args:
        day: a preprocessed Criteo directory holding day 0.
        out: the directory to write.
        pooling: ids per sample of each sparse column, [F].
        table_rows: rows of each column's table, [F].
        row_group_rows: rows per row group.
        lists: store the multi-hot ids, (id + multi-hot offset) % rows, as list<int> columns where
            the pooling is above 1; otherwise store each column's single ids as int columns.

    Returns:
        `out`, holding float32 I1..I13, C1..C26 and an int32 label.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dlrm.data.criteo.format import FIELD_NAMES, SPARSE_NAMES, day_paths
    from dlrm.data.criteo.loader import multi_hot_offsets
    from dlrm.data.parquet.files import write_options

    arrays = {k: np.load(path, mmap_mode="r") for k, path in day_paths(str(day), 0).items()}
    sparse, n = arrays["sparse"], len(arrays["labels"])
    columns = {"label": pa.array(np.ascontiguousarray(arrays["labels"][:, 0]))}
    columns |= {f"I{i + 1}": pa.array(np.ascontiguousarray(arrays["dense"][:, i])) for i in range(13)}
    for c, (offsets, rows) in enumerate(zip(multi_hot_offsets(pooling, table_rows), table_rows, strict=True)):
        ids = np.ascontiguousarray(sparse[:, c])
        if lists and offsets.size > 1:
            values = ((ids[:, None].astype(np.int64) + offsets) % rows).astype(sparse.dtype).reshape(-1)
            starts = np.arange(0, n * offsets.size + 1, offsets.size, dtype=np.int32)
            ids = pa.ListArray.from_arrays(pa.array(starts), pa.array(values))
        columns[SPARSE_NAMES[c]] = ids
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table({name: columns[name] for name in FIELD_NAMES})
    table = table.cast(pa.schema([f.with_nullable(False) for f in table.schema]))  # as `convert --required`
    pq.write_table(table, out / "day_0.parquet", row_group_size=row_group_rows, **write_options(table.schema))
    return out


def use_random_day(
    cfg: Config, source: str, directory: Path, rows: int, row_group_rows: int, parquet_layout: str = "base"
) -> None:
    """Point `cfg.data` at one day of `rows` random rows under `directory`, writing it on first use.

    Args:
        cfg: the config to change in place.
        source: "criteo" (the preprocessed day) or "parquet" (the same rows as Parquet).
        directory: where the day's files are kept between calls.
        rows: rows of the day.
        row_group_rows: rows per Parquet row group.
        parquet_layout: "base" (single ids, expanded by the source) or "lists" (expanded ids stored).

    Both sources read in file order, so they give the same batches.
    """
    from dlrm.config import ParquetConfig, SparseColumnConfig
    from dlrm.config.choices import SparseKind
    from dlrm.data.criteo.format import SPARSE_NAMES
    from dlrm.data.source import feature_layout

    names, table_rows, pooling = feature_layout(cfg)
    day = directory / "criteo"
    if not (day / "manifest.json").exists():
        day.mkdir(parents=True, exist_ok=True)
        write_random_day(day, rows, table_rows)
    cfg.data.source = type(cfg.data.source)(source)  # the config's own type for it (a str enum)
    if source == "criteo":
        multi_hot = pooling if max(pooling) > 1 else None
        cfg.data.criteo = CriteoConfig(
            dir=str(day), train_days=[0], multi_hot_sizes=multi_hot, shuffle=False, verify_checksums=False
        )
        return
    lists = parquet_layout == "lists"
    path = directory / "parquet"
    if not path.exists():
        write_parquet_day(day, path, pooling, table_rows, row_group_rows, lists)
    sparse = [
        SparseColumnConfig(name=name, column=column, kind=SparseKind.ids if lists and p > 1 else SparseKind.id)
        for name, column, p in zip(names, SPARSE_NAMES, pooling, strict=True)
    ]
    dense = [f"I{i + 1}" for i in range(13)]
    multi_hot = list(pooling) if not lists and max(pooling) > 1 else None
    cfg.data.parquet = ParquetConfig(
        path=str(path), dense=dense, sparse=sparse, labels=["label"], shuffle=False, multi_hot_sizes=multi_hot
    )


def measure(args: argparse.Namespace, cfg: Config, source: str, directory: Path, ranks: int, workers: int = 0) -> dict:
    """Time one source on the host; criteo and parquet read the random day under `directory`.

    Args:
        source: "synthetic", "criteo" or "parquet".
        ranks: the world size whose rank 0 is timed.
        workers: the Parquet source's reader workers (0: its default).

    Returns:
        The source-only figures as a dict.
    """
    from dlrm.bench.training import source_only

    timing = argparse.Namespace(
        ranks=args.ranks, device="cpu", threads=args.threads, warmup=args.warmup, window=args.window,
        windows=args.windows,
    )  # fmt: skip
    if source == "synthetic":
        cfg.data.source = type(cfg.data.source)(source)
        cfg.data.synthetic.on_device = True  # made on `device`: the host here
        return source_only(timing, cfg)
    group_rows = args.row_group_rows or cfg.data.global_batch_size // ranks
    use_random_day(cfg, source, directory, args.rows, group_rows, args.parquet_layout)
    if source == "parquet":
        cfg.data.parquet.reader_workers = workers
    result = source_only(timing, cfg)
    if source == "parquet":
        result["reader_workers"] = workers
    result["bytes_on_disk"] = sum(f.stat().st_size for f in (directory / source).iterdir())
    return result


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m dlrm.bench.batches", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, of {', '.join(SOURCES)}")
    parser.add_argument("--ranks", type=int, default=0, help="world size whose rank 0 is timed (0: the topology's)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    parser.add_argument("--rows", type=int, default=393_216, help="rows of the random Criteo day (6 x 65,536)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches after the first")
    parser.add_argument("--window", type=int, default=10, help="batches per timed window")
    parser.add_argument("--windows", type=int, default=7, help="timed windows")
    parser.add_argument(
        "--parquet-layout",
        default="base",
        choices=("base", "lists"),
        help="parquet: the day's ids, expanded as read (base), or the expanded ids stored (lists)",
    )
    parser.add_argument(
        "--row-group-rows", type=int, default=0, help="parquet: rows per row group (0: one rank's batch)"
    )
    parser.add_argument(
        "--reader-workers",
        default="0",
        help="parquet: comma-separated data.parquet.reader_workers counts, each measured (0: the source's default)",
    )
    parser.add_argument("--target", type=float, default=TARGET_SAMPLES_PER_S, help="samples/s per process to reach")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    try:
        args, overrides = parser.parse_known_args(argv)
        sources = [s.strip() for s in args.sources.split(",") if s.strip()]
        if not sources or any(s not in SOURCES for s in sources):
            parser.error(f"--sources {args.sources!r}: choose from {', '.join(SOURCES)}")
        workers_list = worker_counts(parser, args.reader_workers)
        if (
            min(args.ranks, args.threads, args.warmup, args.row_group_rows) < 0
            or min(args.window, args.windows, args.rows) < 1
        ):
            parser.error(
                "--ranks, --threads, --warmup, --row-group-rows must be >= 0; --window, --windows, --rows >= 1"
            )
        if not any(o.startswith(("experiment=", "+experiment=")) for o in overrides):
            overrides = ["experiment=bench_dcnv2", *overrides]
        from dlrm.bench.training import compose_config

        cfg = compose_config(overrides)
        ranks = checked_ranks(parser, args, cfg, sources, workers_list)
        results = {}
        with tempfile.TemporaryDirectory(prefix="dlrm_bench_batches_") as tmp:  # the random day, removed at the end
            for source, workers in [(s, w) for s in sources for w in (workers_list if s == "parquet" else [0])]:
                key = f"parquet_workers_{workers}" if source == "parquet" and len(workers_list) > 1 else source
                results[key] = result = measure(args, cfg, source, Path(tmp), ranks, workers)
                result["target_samples_per_s"] = args.target
                result["fraction_of_target"] = result["source_samples_per_s_per_rank"] / args.target
                print(line(result, ranks), flush=True)
    except Exception as e:
        exit_on_user_error(e, 0)
        raise
    if args.out is not None:
        write_json_atomic(args.out, results)


def worker_counts(parser: ArgumentParser, text: str) -> list[int]:
    """The --reader-workers counts; `parser.error` (exit 2) on anything but counts >= 0."""
    counts = [int(w) if w.strip().isdigit() else -1 for w in text.split(",")]
    if min(counts) < 0:
        parser.error(f"--reader-workers {text!r}: comma-separated counts >= 0 (0: the source's default)")
    return counts


def checked_ranks(
    parser: ArgumentParser, args: argparse.Namespace, cfg: Config, sources: list[str], workers: list[int]
) -> int:
    """The world size whose rank 0 is timed; `parser.error` (exit 2) where the options cannot measure."""
    from dlrm.data.parquet.reader import CACHED_ROW_GROUPS

    tp = cfg.topology
    ranks = args.ranks or tp.nodes * (tp.ranks_per_node or 1)
    batch = cfg.data.global_batch_size
    if batch % ranks:
        parser.error(f"--ranks {ranks}: data.global_batch_size={batch} must be divisible by it")
    if {"criteo", "parquet"} & set(sources) and args.rows < batch:
        parser.error(f"--rows {args.rows}: at least one global batch ({batch}) for criteo and parquet")
    unit = max(batch, args.row_group_rows)  # rank 0 reads a row group per unit at least
    default = max(1, min(4, len(os.sched_getaffinity(0)) // ranks))  # the source's default for `ranks` on this node
    cached = CACHED_ROW_GROUPS + max(w or default for w in workers) - 1  # the reader's cache for N workers
    if "parquet" in sources and args.rows // unit <= cached:
        parser.error(
            f"--rows {args.rows}: more than {cached} global batches and row groups ({unit} rows) for parquet with "
            f"these --reader-workers, else rank 0 rereads its row groups from the reader's cache of {cached} decoded"
        )
    return ranks


def line(result: dict, ranks: int) -> str:
    rates = result["source_samples_per_s_windows"]
    workers = f", {result['reader_workers'] or 'default'} reader worker(s)" if "reader_workers" in result else ""
    return (
        f"{result['source']}: {result['samples_per_rank']:,} samples per process ({ranks} ranks), "
        f"{result['ids_per_sample']} ids per sample, {result['torch_threads']} thread(s){workers}: "
        f"{result['source_samples_per_s_per_rank'] / 1e6:.2f}M samples/s (median of {len(rates)} windows, "
        f"{min(rates) / 1e6:.2f}-{max(rates) / 1e6:.2f}M), {result['source_samples_per_cpu_s'] / 1e6:.2f}M per "
        f"CPU-second; {result['fraction_of_target']:.0%} of {result['target_samples_per_s'] / 1e6:g}M"
    )


if __name__ == "__main__":
    main()
