"""Benchmark: rows/s of Criteo preprocessing against TorchRec's `BinaryCriteoUtils.tsv_to_npys`,
and loader samples/s.

    python -m dlrm.bench.criteo_preprocess --sample criteo_sample.tsv [--rows 1000000] [--workers 2] [--dir DIR]
                                         [--skip-torchrec]

Generates a Criteo-format file of `--rows` lines from a real sample (`--sample`, or $CRITEO_SAMPLE) by
perturbing its ids and counts, converts it with both tools and reads it back with `CriteoSource` on
2 ranks in one process. Everything is written into a new private directory (under --dir if given,
else the system's temp dir) and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.data.criteo.format import NUM_DENSE, NUM_FIELDS, ParseOptions


def generate(path: str, rows: int, sample: str, seed: int = 0) -> None:
    """Write `rows` Criteo lines: sample rows with random new hex ids (same missing pattern) and scaled counts."""
    rng = np.random.default_rng(seed)
    with open(sample, "rb") as f:
        base = [line.rstrip(b"\n").split(b"\t") for line in f if line.strip()]
    base = [r for r in base if len(r) == NUM_FIELDS]
    block = 100_000
    with open(path, "wb") as out:
        for start in range(0, rows, block):
            n = min(block, rows - start)
            pick = rng.integers(0, len(base), n)
            ids = rng.integers(0, 2**32, (n, NUM_FIELDS - 1 - NUM_DENSE), dtype=np.uint64)
            ids = [[f"{v:08x}".encode() for v in row] for row in ids.tolist()]
            scale = rng.integers(1, 4, n)
            lines = []
            for i in range(n):
                r = base[pick[i]]
                dense = [str(int(x) * int(scale[i])).encode() if x else b"" for x in r[1 : 1 + NUM_DENSE]]
                sparse = [ids[i][j] if r[1 + NUM_DENSE + j] else b"" for j in range(len(ids[i]))]
                lines.append(b"\t".join([r[0], *dense, *sparse]))
            out.write(b"\n".join(lines) + b"\n")


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the preprocessing workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None) -> None:
    ap = ArgumentParser(prog="python -m dlrm.bench.criteo_preprocess", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None, help="parent of the private work directory (default: the temp dir)")
    ap.add_argument(
        "--sample",
        default=os.environ.get("CRITEO_SAMPLE"),
        help="real Criteo TSV rows to perturb (default: $CRITEO_SAMPLE)",
    )
    ap.add_argument("--skip-torchrec", action="store_true")
    ap.add_argument("--batch", type=int, default=8192, help="global batch size of the loader benchmark")
    try:
        a = ap.parse_args(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if not a.sample or not os.path.isfile(a.sample):
        print(
            f"error: Criteo sample {a.sample!r} not found: pass --sample FILE (Criteo TSV rows) or set CRITEO_SAMPLE",
            file=sys.stderr,
        )
        sys.exit(2)
    if a.dir is not None and not os.path.isdir(a.dir):
        print(f"error: --dir {a.dir!r} is not a directory: create it, or leave --dir out", file=sys.stderr)
        sys.exit(2)
    if a.rows < 1 or a.workers < 1 or a.batch < 2:
        print("error: --rows and --workers must be >= 1 and --batch >= 2", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="criteo_bench_", dir=a.dir) as work:
        run(a, work)


def run(a: argparse.Namespace, work: str) -> None:
    """The benchmark, with every file under the private directory `work`."""
    tsv = os.path.join(work, f"criteo_{a.rows}.tsv")
    t = time.time()
    generate(tsv, a.rows, a.sample)
    print(f"generated {tsv} ({os.path.getsize(tsv) / 1e6:.0f} MB) in {time.time() - t:.1f}s")

    from dlrm.data.criteo.preprocess import preprocess

    out = os.path.join(work, "ours")
    opts = ParseOptions(policy="fail", id_map="modulo", table_sizes=tuple([10_000_000] * 26))
    t, c = time.time(), _cpu()
    m = preprocess([tsv], out, opts, workers=a.workers, progress_every=1e9)
    ours, ours_cpu = time.time() - t, _cpu() - c
    rows = m["total_rows"]
    print(
        f"ours     ({a.workers} workers): {rows:,} rows in {ours:.2f}s = {rows / ours:,.0f} rows/s; "
        f"{ours_cpu:.2f} CPU-s = {rows / ours_cpu:,.0f} rows per CPU-s"
    )

    if not a.skip_torchrec:
        _against_torchrec(tsv, work, out, a.rows, a.workers, ours, ours_cpu)
    _loader_speed(out, a.batch)


def _against_torchrec(tsv: str, work: str, out: str, rows: int, workers: int, ours: float, ours_cpu: float) -> None:
    """TorchRec's tsv_to_npys on the same file: its speed beside ours, and whether the outputs agree."""
    from torchrec.datasets.criteo import BinaryCriteoUtils

    tr = os.path.join(work, "torchrec")
    os.makedirs(tr, exist_ok=True)
    t, c = time.time(), _cpu()
    BinaryCriteoUtils.tsv_to_npys(tsv, *(os.path.join(tr, f"day_0_{k}.npy") for k in ("dense", "sparse", "labels")))
    theirs, theirs_cpu = time.time() - t, _cpu() - c
    print(
        f"torchrec tsv_to_npys:     {rows:,} rows in {theirs:.2f}s = {rows / theirs:,.0f} rows/s; "
        f"{theirs_cpu:.2f} CPU-s = {rows / theirs_cpu:,.0f} rows per CPU-s"
    )
    print(
        f"speed-up: {theirs / ours:.1f}x wall clock, {theirs_cpu / ours_cpu:.1f}x per CPU-second "
        f"(wall clock needs {workers} idle cores; check `uptime`: load {os.getloadavg()[0]:.1f})"
    )

    def same(kind, mod=None):
        theirs = np.load(os.path.join(tr, f"day_0_{kind}.npy"))
        ours_ = np.load(os.path.join(out, f"day_0_{kind}.npy"))
        return np.array_equal(theirs if mod is None else theirs % mod, ours_)

    print(f"same labels: {same('labels')}, same hashed ids: {same('sparse', 10_000_000)}")


def _loader_speed(out: str, batch: int) -> None:
    """The Criteo loader's samples/s over the preprocessed day, one-hot and MLPerf multi-hot (2 ranks)."""
    from dlrm.config import CriteoConfig
    from dlrm.data.criteo.loader import CriteoSource

    names = [f"C{i + 1}" for i in range(26)]
    for multi_hot in (None, "mlperf"):
        from dlrm.data.criteo.format import MULTI_HOT_SIZES

        cfg = CriteoConfig(dir=out, train_days=[0], multi_hot_sizes=list(MULTI_HOT_SIZES) if multi_hot else None)
        src = CriteoSource(cfg, names, [10_000_000] * 26, batch, seed=0)
        world, steps = 2, min(src.num_batches("train"), 60)
        its = [src.batches("train", r, world) for r in range(world)]
        for it in its:
            next(it)  # start the prefetch threads
        t = time.time()
        for _ in range(steps - 1):
            for it in its:
                next(it)
        dt = time.time() - t
        kind = "multi-hot" if multi_hot else "one-hot  "
        print(
            f"loader {kind} 2 ranks: {(steps - 1) * batch / dt:,.0f} samples/s "
            f"(global batch {batch}, both ranks in one process)"
        )
        for it in its:
            it.close()


if __name__ == "__main__":
    main()
