"""Preprocess raw Criteo TSV files (plain or .gz) into TorchRec's binary .npy layout, plus manifest.json.

    python -m dlrm.data.criteo.preprocess --out DIR [--policy fail|skip] [--table-sizes kaggle|1tb|N|n1,..,n26]
                                   [--id-map modulo|none|contiguous] [--min-count N] [--shuffle-seed S]
                                   [--workers K] [--force] FILE...

Ids: `modulo` hashes int(hex, 16) into --table-sizes; `none` keeps raw ids (checked against them if given);
`contiguous` maps ids seen >= --min-count times in all files to rows 1..K (0 = rare), as MLPerf does (vocab_C{c}.npy).

Input file i becomes day_{i}_{dense,sparse,labels}.npy, files in parallel (a plain file also in byte
ranges when there are fewer files than workers). Each day is published whole, its day_{i}.json last: a
killed run leaves nothing that looks complete, and a re-run redoes only the days whose day_{i}.json does
not match the input and options (--force: all). One run at a time per --out (--out/.preprocess.lock).
Bad flags, inputs and I/O failures are one `error: ...` line and exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import write_json_atomic
from dlrm.data.criteo.days import (
    MANIFEST,
    day_json,
    finish_day,
    input_stamp,
    is_complete,
    options_stamp,
    plan_ranges,
    read_manifest,
)
from dlrm.data.criteo.format import (
    DENSE_TRANSFORM,
    KAGGLE_TABLE_SIZES,
    NUM_SPARSE,
    SPARSE_NAMES,
    TB_TABLE_SIZES,
    CriteoDataError,
    ParseOptions,
)
from dlrm.data.criteo.id_remap import remap_contiguous
from dlrm.data.criteo.ranges import RangeResult, convert_range, set_progress_counter

FORMAT_VERSION = 1


def parse_table_sizes(text: str | None) -> list[int] | None:
    """'kaggle' | '1tb' | 'N' (all tables) | 'n1,...,n26' -> 26 sizes (None stays None)."""
    if text is None:
        return None
    if text.lower() == "kaggle":
        return list(KAGGLE_TABLE_SIZES)
    if text.lower() == "1tb":
        return list(TB_TABLE_SIZES)
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) == 1:
        sizes *= NUM_SPARSE
    if len(sizes) != NUM_SPARSE or not all(1 <= s < 2**63 for s in sizes):
        raise CriteoDataError(
            f"--table-sizes {text!r}: give kaggle, 1tb, one size or {NUM_SPARSE} comma-separated sizes, "
            f"each an integer in [1, 2^63)"
        )
    return sizes


class _Progress(threading.Thread):
    """Prints lines/s and the ETA (from input bytes) to stderr every `every` seconds."""

    def __init__(self, counter, total_bytes: int, every: float):
        super().__init__(daemon=True)
        self.counter, self.total, self.every = counter, max(1, total_bytes), every
        self.stop = threading.Event()
        self.t0 = time.time()

    def run(self):
        while not self.stop.wait(self.every):
            done, lines = self.counter[0], self.counter[1]
            dt = time.time() - self.t0
            eta = (self.total - done) * dt / done if done else float("inf")
            print(
                f"preprocess: {lines:,} lines ({100 * done / self.total:.0f}% of {self.total / 1e6:,.0f} MB input), "
                f"{lines / dt:,.0f} lines/s, ETA {eta:,.0f}s",
                file=sys.stderr,
                flush=True,
            )


def check_inputs(files: Sequence[str], out: str) -> None:
    """Refuse before any work: no file, a missing, unreadable or repeated input, a directory, --out a file."""
    if not files:
        raise CriteoDataError("give at least one input file (Criteo TSV, plain or .gz)")
    seen: dict[tuple, int] = {}
    for i, p in enumerate(files):
        if os.path.isdir(p):
            raise CriteoDataError(f"input {p!r} is a directory: give the Criteo files inside it (one per day)")
        if not os.path.exists(p):
            raise CriteoDataError(f"input file {p!r} does not exist: check the path")
        if not os.path.isfile(p):
            raise CriteoDataError(f"input {p!r} is not a regular file: give a Criteo TSV file (plain or .gz)")
        try:
            with open(p, "rb") as f:
                f.read(2)
        except OSError as e:
            raise CriteoDataError(
                f"input file {p!r} cannot be read ({e.strerror or e}): make it readable (chmod +r) or give another file"
            ) from None
        st = os.stat(p)
        key = (st.st_dev, st.st_ino)
        if key in seen:
            j = seen[key]
            raise CriteoDataError(
                f"input files {files[j]!r} (day {j}) and {p!r} (day {i}) are the same file: each input becomes "
                f"one day, so its rows would be in two days (train/eval leakage); list it once"
            )
        seen[key] = i
    if os.path.exists(out) and not os.path.isdir(out):
        raise CriteoDataError(f"--out {out!r} is a file: give a directory (it is created if missing)")


def check_numbers(workers: int, block_bytes: int, progress_every: float, min_count: int | None) -> None:
    """Refuse flag values that would do nothing, spin or fail later."""
    if workers < 1:
        raise CriteoDataError(f"--workers {workers}: give at least 1 (processes that convert files)")
    if not 1 <= block_bytes <= 4 << 30:
        raise CriteoDataError(f"--block-mb {block_bytes / (1 << 20):g}: give a size in MB in (0, 4096] (default 8)")
    if not (math.isfinite(progress_every) and progress_every > 0):
        raise CriteoDataError(f"--progress-every {progress_every}: give a positive number of seconds")
    if min_count is not None and min_count < 1:
        raise CriteoDataError(f"--min-count {min_count}: give a count >= 1 (ids seen fewer times map to row 0)")


@contextlib.contextmanager
def _locked(out: str):
    """Hold an exclusive lock on `out` (fcntl.flock on out/.preprocess.lock): one run per directory."""
    path = os.path.join(out, ".preprocess.lock")
    try:  # never through a planted symlink
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise CriteoDataError(
            f"cannot open the lock {path} ({e.strerror}): remove it if it is a link, or give another --out"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            raise CriteoDataError(
                f"--out {out!r} is in use by another preprocess run (pid {holder}, lock {path}): wait for it "
                f"to finish, or give another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _os_error(e: OSError, out: str) -> CriteoDataError:
    """An OSError during preprocessing as one message with the file and the fix."""
    where = e.filename or out
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space or give another --out; finished days are kept and a re-run continues from them"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "inputs must be readable and --out writable: fix the permissions or give another --out"
    else:
        fix = "check the file and its device, then re-run (finished days are kept)"
    return CriteoDataError(f"{where}: {e.strerror or e}: {fix}")


def preprocess(
    files: Sequence[str],
    out: str,
    opts: ParseOptions,
    workers: int = 1,
    force: bool = False,
    block_bytes: int = 8 << 20,
    min_range_bytes: int = 16 << 20,
    progress_every: float = 5.0,
    contiguous_min_count: int | None = None,
) -> dict:
    """Convert `files` into `out`, day i from files[i]; one run at a time per `out` (a lock file in it).

    Args:
        contiguous_min_count: remap raw ids to contiguous rows afterwards (`remap_contiguous`); all
            days are then redone unless a finished contiguous run with the same inputs and count exists.

    Returns:
        The manifest, also written to out/manifest.json.

    Raises:
        CriteoDataError: bad arguments, inputs or I/O failures; earlier outputs stay until a new day is complete.
    """
    check_inputs(files, out)
    check_numbers(workers, block_bytes, progress_every, contiguous_min_count)
    if contiguous_min_count is not None and (opts.id_map != "none" or opts.table_sizes is not None):
        raise CriteoDataError("--id-map contiguous builds ids from raw ids: drop --table-sizes")
    kw: dict[str, Any] = dict(
        workers=workers, block_bytes=block_bytes, min_range_bytes=min_range_bytes, progress_every=progress_every
    )
    try:
        os.makedirs(out, exist_ok=True)
        with _locked(out):
            if contiguous_min_count is None:
                return _convert(files, out, opts, force=force, **kw)
            old = read_manifest(out)
            try:
                reuse = (
                    not force
                    and old is not None
                    and old["id_map"].get("min_count") == contiguous_min_count
                    and [d["input"] for d in old["days"]] == [input_stamp(p) for p in files]
                    and old["options"]["policy"] == opts.policy
                    and old["options"].get("shuffle_seed") == opts.shuffle_seed
                )
            except (KeyError, TypeError, AttributeError):  # a damaged manifest: redo
                reuse = False
            if reuse and old is not None:
                return old
            raw = _convert(files, out, opts, force=True, **kw)
            return remap_contiguous(out, raw, contiguous_min_count)
    except OSError as e:
        raise _os_error(e, out) from None


def _manifest(
    files: Sequence[str], out: str, opts: ParseOptions, workers: int, block_bytes: int, done_meta: dict, elapsed: float
) -> dict:
    """manifest.json: every day's json (this run's days in `done_meta`), the layout and the options."""
    days = []
    for d in range(len(files)):
        with open(day_json(out, d)) as f:
            days.append(json.load(f))
    new_rows = sum(done_meta[d]["rows"] for d in done_meta)
    manifest = {
        "format": "torchrec-binary-criteo",
        "version": FORMAT_VERSION,
        "days": days,
        "total_rows": sum(m["rows"] for m in days),
        "total_skipped": sum(m["skipped"] for m in days),
        "dense_transform": DENSE_TRANSFORM,
        "labels": "int32 0/1, shape [rows, 1]",
        "sparse_columns": SPARSE_NAMES,
        "sparse_dtype": opts.sparse_dtype.name,
        "table_sizes": list(opts.table_sizes) if opts.table_sizes else None,
        "id_map": {
            "kind": opts.id_map,
            "rule": "int(hex, 16) % table_sizes[c]; missing -> 0"
            if opts.id_map == "modulo"
            else "int(hex, 16); missing -> 0" + ("; checked < table_sizes[c]" if opts.table_sizes else ""),
        },
        "options": {**options_stamp(opts), "workers": workers, "block_bytes": block_bytes},
        "last_run": {
            "days_converted": sorted(done_meta),
            "rows": new_rows,
            "seconds": round(elapsed, 3),
            "rows_per_s": round(new_rows / elapsed) if elapsed > 0 else None,
        },
    }
    return manifest


def _convert(
    files: Sequence[str],
    out: str,
    opts: ParseOptions,
    workers: int,
    force: bool,
    block_bytes: int,
    min_range_bytes: int,
    progress_every: float,
) -> dict:
    """The conversion of `preprocess` (arguments checked, `out` locked)."""
    for stale in glob.glob(os.path.join(out, ".tmp_day_*")):  # leftovers of a killed run
        os.remove(stale)
    todo = [d for d, p in enumerate(files) if force or not is_complete(out, d, p, opts)]
    plan = plan_ranges({d: files[d] for d in todo}, out, opts, workers, block_bytes, min_range_bytes)
    t0 = time.time()
    total_bytes = sum(os.path.getsize(files[d]) for d in todo)
    tasks = [t for d in todo for t in plan[d]]
    day_of = {id(t): d for d in todo for t in plan[d]}
    pending: dict[int, list[RangeResult]] = {d: [] for d in todo}
    done_meta: dict[int, dict] = {}

    # fork is cheapest, but unsafe once torch (and its thread pools) is loaded in this process
    ctx = mp.get_context("fork" if "torch" not in sys.modules and sys.platform == "linux" else "spawn")
    counter = ctx.Array("q", 2)  # input bytes consumed, lines parsed
    progress = _Progress(counter, total_bytes, progress_every)
    try:
        if workers <= 1 or len(tasks) <= 1:
            set_progress_counter(counter)
            results = map(convert_range, tasks)
            pool = None
        else:
            pool = ctx.Pool(min(workers, len(tasks)), initializer=set_progress_counter, initargs=(counter,))
            results = pool.imap(convert_range, tasks)
        progress.start()  # after the fork: the children never hold this thread's locks
        try:
            for t, r in zip(tasks, results, strict=True):
                d = day_of[id(t)]
                pending[d].append(r)
                if len(pending[d]) == len(plan[d]):
                    done_meta[d] = finish_day(out, d, files[d], pending.pop(d), opts)
                    m = done_meta[d]
                    print(
                        f"preprocess: day {d} ({files[d]}): {m['rows']:,} rows, {m['skipped']:,} skipped",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    finally:
        progress.stop.set()
        set_progress_counter(None)
        for stale in glob.glob(os.path.join(out, ".tmp_day_*")):
            os.remove(stale)
    manifest = _manifest(files, out, opts, workers, block_bytes, done_meta, time.time() - t0)
    write_json_atomic(os.path.join(out, MANIFEST), manifest)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.data.criteo.preprocess", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("files", nargs="+", help="Criteo TSV files (plain or .gz); file i becomes day_i")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument(
        "--policy", choices=("fail", "skip"), default="fail", help="on a bad line: stop, or drop and count it"
    )
    ap.add_argument("--table-sizes", default=None, help="kaggle | 1tb | N | n1,...,n26 (rows of each table)")
    ap.add_argument(
        "--id-map",
        choices=("modulo", "none", "contiguous"),
        default=None,
        help="modulo: id %% table size (default with --table-sizes); none: raw ids, checked < table "
        "size; contiguous: ids seen >= --min-count times -> rows 1..K, others -> 0 (MLPerf-style)",
    )
    ap.add_argument("--min-count", type=int, default=1, help="frequency threshold of --id-map contiguous")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--block-mb", type=float, default=8.0, help="text parsed per block (bounds memory per worker)")
    ap.add_argument(
        "--shuffle-seed", type=int, default=None, help="permute the rows of each day (seeded by seed and day)"
    )
    ap.add_argument("--force", action="store_true", help="redo days that are already complete")
    ap.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    try:
        a = ap.parse_args(argv)
        sizes = parse_table_sizes(a.table_sizes)
        id_map = a.id_map or ("modulo" if sizes else "none")
        contiguous = a.min_count if id_map == "contiguous" else None
        if contiguous is not None and sizes:
            raise CriteoDataError("--id-map contiguous computes the table sizes: drop --table-sizes")
        if not (math.isfinite(a.block_mb) and a.block_mb > 0):
            raise CriteoDataError(f"--block-mb {a.block_mb}: give a size in MB in (0, 4096] (default 8)")
        try:
            parse_map = "none" if contiguous is not None else id_map
            opts = ParseOptions(a.policy, parse_map, tuple(sizes) if sizes else None, a.shuffle_seed)
        except ValueError as e:
            raise CriteoDataError(str(e)) from None
        m = preprocess(
            a.files,
            a.out,
            opts,
            workers=a.workers,
            force=a.force,
            block_bytes=int(a.block_mb * (1 << 20)),
            progress_every=a.progress_every,
            contiguous_min_count=contiguous,
        )
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lr = m["last_run"]
    print(
        f"preprocess: wrote {a.out}/{MANIFEST}: {m['total_rows']:,} rows in {len(m['days'])} day(s), "
        f"{m['total_skipped']:,} skipped; this run {lr['rows']:,} rows in {lr['seconds']:.1f}s "
        f"({lr['rows_per_s'] or 0:,} rows/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
