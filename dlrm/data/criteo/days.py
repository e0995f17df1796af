"""The days of a preprocessing run: each input file i is day i, converted in byte ranges, then
finished (the policy applied, parts joined and shuffled, renamed into place) with its `day_{i}.json`
written last; a day whose json matches its input and options is complete and skipped by a re-run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict

import numpy as np

from dlrm.common.io import publish, sha256_file, write_json_atomic
from dlrm.data.criteo.format import KINDS, NUM_DENSE, NUM_SPARSE, CriteoFormatError, ParseOptions, day_paths
from dlrm.data.criteo.npy import concat_parts, shuffle_rows
from dlrm.data.criteo.ranges import RangeResult, RangeTask

MANIFEST = "manifest.json"


def input_stamp(path: str) -> dict:
    """What identifies an input file: its absolute path, size and modification time."""
    st = os.stat(path)
    return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def options_stamp(opts: ParseOptions) -> dict:
    """The parse options a day's output depends on, as JSON."""
    return {
        "policy": opts.policy,
        "id_map": opts.id_map,
        "table_sizes": list(opts.table_sizes) if opts.table_sizes else None,
        "sparse_dtype": opts.sparse_dtype.name,
        "shuffle_seed": opts.shuffle_seed,
    }


def day_json(out: str, day: int) -> str:
    """The path of day `day`'s day_{i}.json, written last when the day is complete."""
    return os.path.join(out, f"day_{day}.json")


def is_complete(out: str, day: int, path: str, opts: ParseOptions) -> bool:
    """Whether day `day` of `out` is finished from input `path` with `opts`: its json matches and its
    files have the recorded sizes (a damaged json: False)."""
    try:
        with open(day_json(out, day)) as f:
            meta = json.load(f)
        if meta.get("input") != input_stamp(path) or meta.get("options") != options_stamp(opts):
            return False
        return all(
            os.path.exists(p) and os.path.getsize(p) == meta["files"][k]["bytes"]
            for k, p in day_paths(out, day).items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a damaged day_{i}.json: redo the day
        return False


def plan_ranges(
    days: dict[int, str], out: str, opts: ParseOptions, workers: int, block_bytes: int, min_range_bytes: int
):
    """{day: [RangeTask]}: gzip -> one task; plain -> up to ceil(workers / files) byte ranges of >= min_range_bytes."""
    per_file = max(1, math.ceil(workers / max(1, len(days))))
    plan = {}
    for day, path in days.items():
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        n = 1 if gz else max(1, min(per_file, size // max(1, min_range_bytes)))
        starts = [size * k // n for k in range(n)]
        ends: list[int | None] = [*starts[1:], None]
        prefix = os.path.join(out, f".tmp_day_{day}_part")
        plan[day] = [RangeTask(path, f"{prefix}{k}", starts[k], ends[k], opts, block_bytes) for k in range(n)]
    return plan


def _check_results(path: str, results: list[RangeResult], opts: ParseOptions) -> int:
    """Number the bad lines of a day's sorted range results by file line, and apply the policy to them:
    a parse error, a broken compressed stream or an empty file (policy fail) is refused. Returns the lines."""
    # Range-local line numbers -> file line numbers.
    offsets, base = [], 0
    for r in results:
        offsets.append(base)
        base += r.lines
    for r, off in zip(results, offsets, strict=True):
        for b in r.bad + ([r.error] if r.error else []):
            if b.line > 0:
                b.line += off
    lines = sum(r.lines for r in results)
    first_error = next((r.error for r in results if r.error), None)
    if first_error is not None:
        raise CriteoFormatError(
            f"{first_error.describe(path)}. Fix the input, or run with --policy skip to drop and count bad lines."
        )
    fatal = next((r.fatal for r in results if r.fatal), None)
    if fatal:
        raise CriteoFormatError(
            f"{path}: {fatal} after line {lines}. Re-download or re-compress the file, or run with "
            f"--policy skip to keep the {sum(r.rows for r in results)} complete rows read before the break."
        )
    if lines == 0 and not any(r.truncated for r in results):
        if opts.policy == "fail":
            raise CriteoFormatError(
                f"{path}: the file is empty (0 lines). Remove it from the inputs, or run with --policy skip."
            )
    return lines


def finish_day(out: str, day: int, path: str, results: list[RangeResult], opts: ParseOptions) -> dict:
    """Apply the policy to a day's range results, concatenate parts, rename, write day_{i}.json.

    Returns:
        The day's json (input, options, lines, rows, skipped lines, max ids, files).

    Raises:
        CriteoFormatError: under policy fail, a bad line, a broken stream or an empty file.
    """
    results.sort(key=lambda r: r.task.start)
    lines = _check_results(path, results, opts)
    final = day_paths(out, day)
    files = {}
    rows = None
    cols = {"dense": NUM_DENSE, "sparse": NUM_SPARSE, "labels": 1}
    dtypes = {"dense": np.float32, "sparse": opts.sparse_dtype, "labels": np.int32}
    tmp = {k: os.path.join(out, f".tmp_day_{day}_{k}.npy") for k in KINDS}
    for k in KINDS:
        n, digest = concat_parts([f"{r.task.part_prefix}_{k}.npy" for r in results], tmp[k], dtypes[k], cols[k])
        assert rows is None or n == rows, (k, n, rows)
        rows = n
        files[k] = {"name": os.path.basename(final[k]), "bytes": os.path.getsize(tmp[k]), "sha256": digest}
    if opts.shuffle_seed is not None:
        shuffle_rows(tmp, opts.shuffle_seed, day)
        for k in KINDS:
            files[k]["sha256"] = sha256_file(tmp[k])
    # The new day is complete: only now unpublish the manifest and the old day, and put the new one in place.
    for old in (os.path.join(out, MANIFEST), day_json(out, day)):
        if os.path.exists(old):
            os.remove(old)
    for k in KINDS:
        publish(tmp[k], final[k])
    max_ids = np.max([r.max_ids for r in results], axis=0).tolist()
    bad = [asdict(b) for r in results for b in r.bad][:20]
    meta = {
        "day": day,
        "input": input_stamp(path),
        "options": options_stamp(opts),
        "lines": lines,
        "rows": rows,
        "skipped": sum(r.skipped for r in results),
        "skipped_examples": bad,
        "truncated": any(r.truncated for r in results),
        "empty": lines == 0,
        "max_ids": max_ids,
        "files": files,
    }
    write_json_atomic(day_json(out, day), meta)
    return meta


def read_manifest(out: str) -> dict | None:
    """`out`'s manifest.json as a dict, or None when it is missing or not a JSON object."""
    try:
        with open(os.path.join(out, MANIFEST)) as f:
            m = json.load(f)
        return m if isinstance(m, dict) else None
    except (OSError, ValueError):
        return None
