"""Converting one byte range of a Criteo TSV file (plain or gzip) into part `.npy` files.

`convert_range` reads blocks of whole lines (a range starts at the first line beginning inside it
and ends with the line that crosses its end), parses them with `parse_block` and appends them to part
files; it records bad lines instead of raising, so the caller applies the
policy. Progress is counted in a shared array set by `set_progress_counter` (worker processes).
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field

import numpy as np

from dlrm.data.criteo.format import NUM_DENSE, NUM_SPARSE, BadLine, ParseOptions, parse_block
from dlrm.data.criteo.npy import NpyWriter
from dlrm.data.prefetch import Prefetcher


# ---------------------------------------------------------------- converting one byte range of a file
@dataclass
class RangeTask:
    """Convert the lines starting in bytes [start, end) of `path` (end=None: to the end; gzip: whole file)."""

    path: str
    part_prefix: str  # output files are f"{part_prefix}_{kind}.npy"
    start: int = 0
    end: int | None = None
    opts: ParseOptions = field(default_factory=ParseOptions)
    block_bytes: int = 8 << 20


@dataclass
class RangeResult:
    """What converting one range gave: counts, the max id per column, and its bad lines."""

    task: RangeTask
    rows: int = 0
    lines: int = 0
    skipped: int = 0
    truncated: bool = False
    bad: list[BadLine] = field(default_factory=list)  # the first few, line numbers local to the range
    max_ids: list[int] = field(default_factory=lambda: [-1] * NUM_SPARSE)
    partial: BadLine | None = None  # the cut-off last line of a truncated gzip stream
    error: BadLine | None = None  # policy fail: the first bad line (local numbering)
    fatal: str | None = None  # an unreadable stream under policy fail


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


_progress = None  # multiprocessing.Array('q', 2): [input bytes consumed, lines parsed], shared with the parent


def set_progress_counter(counter) -> None:
    """Count this process's progress in `counter` ([input bytes, lines], shared with the parent)."""
    global _progress
    _progress = counter


def _report(nbytes: int = 0, nlines: int = 0) -> None:
    if _progress is not None and (nbytes or nlines):
        with _progress.get_lock():
            _progress[0] += nbytes
            _progress[1] += nlines


def _fill(read, n: int) -> tuple[bytes, BaseException | None]:
    """Up to n bytes from `read` (fewer only at the end); a broken stream returns what came before it."""
    chunks, got = [], 0
    try:
        while got < n:
            data = read(n - got)
            if not data:
                break
            chunks.append(data)
            got += len(data)
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        return b"".join(chunks), e
    return b"".join(chunks), None


def _blocks(task: RangeTask, result: RangeResult):
    """Yield blocks of complete lines (each ending in '\\n'); sets result.truncated on a broken gzip."""
    raw = open(task.path, "rb")
    try:
        if _is_gzip(task.path):
            read = gzip.GzipFile(fileobj=raw).read1  # read1: data before a truncation is not lost
            limit = None
        else:
            read = raw.read
            if task.start > 0:
                raw.seek(task.start - 1)
                raw.readline()
            limit = None if task.end is None else task.end - raw.tell()
        pending = b""
        reported = raw.tell()
        while True:
            want = task.block_bytes if limit is None else min(task.block_bytes, limit)
            data, err = _fill(read, want) if want > 0 else (b"", None)
            if err is not None:
                result.truncated = True
                result.fatal = f"gzip stream is truncated or corrupt ({err})"
            end = err is not None or len(data) < want or want <= 0
            if limit is not None:
                limit -= len(data)
                if limit <= 0:
                    if not data.endswith(b"\n") and (pending or data):
                        data += raw.readline()  # finish the line that starts before `end`
                    end = True
            _report(raw.tell() - reported)
            reported = raw.tell()
            buf = pending + data
            if end:
                if result.truncated and buf and not buf.endswith(b"\n"):
                    cut = buf.rfind(b"\n") + 1  # a partial last line of a truncated stream: never parse it
                    text = buf[cut:][:80].decode("utf-8", "replace")
                    result.partial = BadLine(-1, "line", text, "incomplete last line of a truncated gzip stream")
                    buf = buf[:cut]
                elif buf and not buf.endswith(b"\n"):
                    buf += b"\n"  # a missing trailing newline is normal
                if buf:
                    yield buf
                return
            cut = buf.rfind(b"\n") + 1
            pending = buf[cut:]
            if cut:
                yield buf[:cut]
    finally:
        raw.close()


def convert_range(task: RangeTask) -> RangeResult:
    """Parse one range into part files `{part_prefix}_{dense,sparse,labels}.npy`; never raises on bad data."""
    res = RangeResult(task)
    opts = task.opts
    writers = {
        "dense": NpyWriter(f"{task.part_prefix}_dense.npy", np.float32, NUM_DENSE),
        "sparse": NpyWriter(f"{task.part_prefix}_sparse.npy", opts.sparse_dtype, NUM_SPARSE),
        "labels": NpyWriter(f"{task.part_prefix}_labels.npy", np.int32, 1),
    }
    max_ids = np.full(NUM_SPARSE, -1, np.int64)
    try:
        blocks = _blocks(task, res)
        if _is_gzip(task.path):
            blocks = Prefetcher(blocks, 2)  # decompress (zlib frees the GIL) while the last block is parsed
        for buf in blocks:
            p = parse_block(buf, opts, first_line=res.lines + 1)
            res.lines += p.lines
            _report(nlines=p.lines)
            if p.bad:
                if opts.policy == "fail":
                    res.error = p.bad[0]
                    return res
                res.skipped += len(p.bad)
                res.bad.extend(p.bad[: max(0, 20 - len(res.bad))])
            writers["dense"].append(p.dense)
            writers["sparse"].append(p.sparse)
            writers["labels"].append(p.labels)
            if len(p.sparse):
                np.maximum(max_ids, p.sparse.max(0).astype(np.int64), out=max_ids)
        if res.partial is not None:
            res.partial.line = res.lines + 1
            res.skipped += 1
            res.bad.append(res.partial)
        res.rows = writers["labels"].rows
        res.max_ids = max_ids.tolist()
        if res.truncated and opts.policy == "skip":
            res.fatal = None
        return res
    finally:
        for w in writers.values():
            w.close()
