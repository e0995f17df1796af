"""The data path alone: samples/s of the batch sources at a training shape, one GPU-feeding process.

    python -m dlrm.bench.batches [--sources synthetic,criteo] [--threads N] [--rows N]
                                      [--warmup N --window N --windows N] [--out F] [hydra overrides]

Issue #27 asks for synthetic and multi-hot Criteo batches at >= 3M samples/s per GPU-feeding process
(`--target`). The config is composed as for training, default `experiment=bench_dcnv2` (MLPerf
DLRM-DCNv2: 26 tables, the multi-hot sizes of `data=criteo_1tb_multihot`, 214 ids per sample, global
batch 65,536 on 8 ranks: 8,192 per rank). Each source is timed by `dlrm.bench.training --source-only`'s loop
(rank 0's slice of `--ranks` ranks, median samples/s of `--windows` windows, samples per CPU-second),
on the host:
- synthetic: `dlrm.data.synthetic.SyntheticSource`, its batches made on the CPU (torch ops, `--threads`
  intra-op threads);
- criteo: `dlrm.data.criteo.loader.CriteoSource` over one preprocessed day of `--rows` random rows
  (ids uniform below the model's table sizes) written to a new temporary directory and removed at
  the end, with the model's pooling as `multi_hot_sizes`: rows read from the memory-mapped files
  (in the page cache), ids expanded on the host in the loader's reader thread, what the training
  thread receives.
Prints one line per source and, with `--out`, writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dlrm.config import Config, CriteoConfig
from dlrm.errors import ArgumentParser, UserError, exit_on_user_error
from dlrm.io import size_and_sha256, write_json_atomic

TARGET_SAMPLES_PER_S = 3e6  # per GPU-feeding process: the data path's goal (about 1.8x the 1.7M a GPU trains)
SOURCES = ("synthetic", "criteo")


def write_random_day(directory: Path, rows: int, table_rows: list[int], seed: int = 0) -> Path:
    """Day 0 of a preprocessed Criteo directory (`dlrm.data.criteo.preprocess`'s layout and manifest) of
    `rows` random rows: dense log-normal-ish, ids uniform in [0, table_rows[c]), labels 0/1."""
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


def measure(args: argparse.Namespace, cfg: Config, source: str) -> dict:
    """`dlrm.bench.training.source_only` of one source of this config on the host (see the module docstring)."""
    from dlrm.bench.training import source_only
    from dlrm.data.loader import feature_layout

    cfg.data.source = type(cfg.data.source)(source)  # the config's own type for it (a str enum)
    timing = argparse.Namespace(
        ranks=args.ranks, device="cpu", threads=args.threads, warmup=args.warmup, window=args.window,
        windows=args.windows,
    )  # fmt: skip
    if source == "synthetic":
        cfg.data.synthetic.on_device = True  # made on `device`: the host here
        return source_only(timing, cfg)
    _, rows, pooling = feature_layout(cfg)
    tmp = Path(tempfile.mkdtemp(prefix="dlrm_bench_batches_"))
    try:
        write_random_day(tmp, args.rows, rows)
        cfg.data.criteo = CriteoConfig(
            dir=str(tmp), train_days=[0], multi_hot_sizes=pooling if max(pooling) > 1 else None, verify_checksums=False
        )
        return source_only(timing, cfg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m dlrm.bench.batches", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, of {', '.join(SOURCES)}")
    parser.add_argument("--ranks", type=int, default=0, help="world size whose rank 0 is timed (0: the topology's)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    parser.add_argument("--rows", type=int, default=262_144, help="rows of the random Criteo day")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches after the first")
    parser.add_argument("--window", type=int, default=10, help="batches per timed window")
    parser.add_argument("--windows", type=int, default=7, help="timed windows")
    parser.add_argument("--target", type=float, default=TARGET_SAMPLES_PER_S, help="samples/s per process to reach")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    try:
        args, overrides = parser.parse_known_args(argv)
        sources = [s.strip() for s in args.sources.split(",") if s.strip()]
        if not sources or any(s not in SOURCES for s in sources):
            parser.error(f"--sources {args.sources!r}: choose from {', '.join(SOURCES)}")
        if min(args.ranks, args.threads, args.warmup) < 0 or min(args.window, args.windows, args.rows) < 1:
            parser.error("--ranks, --threads, --warmup must be >= 0; --window, --windows, --rows >= 1")
        if not any(o.startswith(("experiment=", "+experiment=")) for o in overrides):
            overrides = ["experiment=bench_dcnv2", *overrides]
        from dlrm.bench.training import compose_config

        cfg = compose_config(overrides)
        tp = cfg.topology
        ranks = args.ranks or tp.nodes * (tp.ranks_per_node or 1)
        if "criteo" in sources and args.rows < cfg.data.global_batch_size:
            parser.error(f"--rows {args.rows}: at least one global batch ({cfg.data.global_batch_size}) for criteo")
        results = {}
        for source in sources:
            results[source] = result = measure(args, cfg, source)
            result["target_samples_per_s"] = args.target
            result["fraction_of_target"] = result["source_samples_per_s_per_rank"] / args.target
            print(line(result, ranks), flush=True)
    except Exception as e:
        exit_on_user_error(e, 0)
        raise
    if args.out is not None:
        write_json_atomic(args.out, results)


def line(result: dict, ranks: int) -> str:
    rates = result["source_samples_per_s_windows"]
    return (
        f"{result['source']}: {result['samples_per_rank']:,} samples per process ({ranks} ranks), "
        f"{result['ids_per_sample']} ids per sample, {result['torch_threads']} thread(s): "
        f"{result['source_samples_per_s_per_rank'] / 1e6:.2f}M samples/s (median of {len(rates)} windows, "
        f"{min(rates) / 1e6:.2f}-{max(rates) / 1e6:.2f}M), {result['source_samples_per_cpu_s'] / 1e6:.2f}M per "
        f"CPU-second; {result['fraction_of_target']:.0%} of {result['target_samples_per_s'] / 1e6:g}M"
    )


if __name__ == "__main__":
    main()
