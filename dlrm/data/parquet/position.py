"""The data position of a Parquet training run, recorded rather than derived from the step.

The train rows of one invocation form a stream of passes over the training window's row groups
(`Stream`): pass 0 continues the pass the run was in (the rows of each row group not read in it
yet; all of them for a new run), passes 1, 2, ... read the whole window. Each pass orders its row
groups period by period in time order, shuffled within a period by (seed, pass) where shuffling is
on; rows inside a row group keep their order, so the rows of a row group read so far are always a
prefix of it. A pass holds rows // B global batches (B the global batch size); its remaining rows
are left unread and stay unfinished.

`Stream.record(step)` is what a checkpoint holds (`data_position` in its manifest): the window's
files by identity (path, size, sha256 of the Parquet footer) with the rows read of each row group
in the current pass, and the stream's own start, so that a resume over the same files continues
the same stream exactly and a continuation over a window that gained files starts a stream of the
rows not read yet. `changed_files` names a recorded file that changed or vanished.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow.fs as pafs

POSITION_VERSION = 1
FOOTER_TAIL = 8  # a Parquet file ends with the footer's length (4 bytes, little-endian) and b"PAR1"


def file_identity(fs: pafs.FileSystem, path: str) -> dict:
    """{"path", "size", "footer_sha256"} of a Parquet file: its size and the sha256 of its footer
    (the metadata: schema, row groups, their statistics and offsets), which changes when rows do."""
    with fs.open_input_file(path) as f:
        size = f.size()
        tail = f.read_at(FOOTER_TAIL, size - FOOTER_TAIL) if size >= FOOTER_TAIL else b""
        length = int.from_bytes(tail[:4], "little") if len(tail) == FOOTER_TAIL else 0
        start = max(0, size - FOOTER_TAIL - length)
        footer = f.read_at(size - start, start)
    return {"path": path, "size": int(size), "footer_sha256": hashlib.sha256(footer).hexdigest()}


@dataclass(frozen=True)
class GroupRef:
    """A row group of the window: its dataset index, file path, index in the file, rows and period."""

    group: int
    path: str
    index: int
    rows: int
    period: str


@dataclass
class Stream:
    """The train rows of one invocation as global batches (see the module's docstring).

    Args:
        groups: the window's row groups in time order (file order within a period).
        batch: the global batch size B.
        seed, shuffle: the order of each pass's row groups within a period.
        base_step: the global step of the stream's first batch.
        epoch: the number of the pass the stream starts in (0 for a new run).
        start: rows of each row group (by dataset index) already read in pass `epoch`.
        keyed: whether the window has periods (else one block, ordered as an unpartitioned dataset).
    """

    groups: list[GroupRef]
    batch: int
    seed: int
    shuffle: bool
    base_step: int = 0
    epoch: int = 0
    start: dict[int, int] = field(default_factory=dict)
    keyed: bool = False
    _passes: dict[int, tuple[list[tuple[int, int, int]], np.ndarray]] = field(default_factory=dict, repr=False)

    def order(self, epoch: int) -> list[GroupRef]:
        """The window's row groups in the order of pass `epoch`: periods in time order, each
        period's row groups shuffled by (seed, epoch[, period's place]) where shuffling is on."""
        if not self.shuffle:
            return list(self.groups)
        blocks: list[list[GroupRef]] = []
        for ref in self.groups:
            if self.keyed and blocks and blocks[-1][0].period == ref.period:
                blocks[-1].append(ref)
            elif self.keyed or not blocks:
                blocks.append([ref])
            else:
                blocks[-1].append(ref)
        out = []
        for k, block in enumerate(blocks):
            seed = [self.seed, epoch, k] if self.keyed else [self.seed, epoch]
            out.extend(block[i] for i in np.random.default_rng(seed).permutation(len(block)))
        return out

    def segments(self, p: int) -> tuple[list[tuple[int, int, int]], np.ndarray]:
        """Pass `p` of this stream (0: the one it starts in) as (group, first row, rows) segments and
        their first rows in the pass."""
        if p not in self._passes:
            refs = self.order(self.epoch + p)
            segs = []
            for ref in refs:
                a = self.start.get(ref.group, 0) if p == 0 else 0
                if ref.rows > a:
                    segs.append((ref.group, a, ref.rows - a))
            starts = np.concatenate([[0], np.cumsum([n for _, _, n in segs])]).astype(np.int64)
            self._passes[p] = (segs, starts)
        return self._passes[p]

    def batches_in(self, p: int) -> int:
        """Global batches in pass `p`."""
        return int(self.segments(p)[1][-1]) // self.batch

    def window_rows(self) -> int:
        return sum(ref.rows for ref in self.groups)

    def locate(self, step: int, reading: bool) -> tuple[int, int]:
        """(pass, batch in it) of global step `step` (>= base_step): the batch to read next when
        `reading`; else the position after `step` steps (the end of a pass stays in that pass)."""
        if step < self.base_step:
            raise ValueError(f"step {step} is before this stream's first step {self.base_step}")
        p, j = 0, step - self.base_step
        while j > self.batches_in(p) or (reading and j == self.batches_in(p)):
            j -= self.batches_in(p)
            p += 1
        return p, j

    def slices(self, step: int, offset: int, count: int) -> list[tuple[int, int, int]]:
        """Rows [offset, offset + count) of global batch `step` as (group, first row, rows) pieces."""
        p, j = self.locate(step, reading=True)
        segs, starts = self.segments(p)
        at, left = j * self.batch + offset, count
        i = int(np.searchsorted(starts, at, side="right")) - 1
        pieces = []
        while left > 0:
            g, a, n = segs[i]
            skip = at - int(starts[i])
            m = min(left, n - skip)
            pieces.append((g, a + skip, m))
            at, left, i = at + m, left - m, i + 1
        return pieces

    def steps_for_passes(self, passes: int) -> int:
        """The global step at the end of the stream's first `passes` passes."""
        return self.base_step + sum(self.batches_in(p) for p in range(passes))

    def read_so_far(self, step: int) -> tuple[int, dict[int, int]]:
        """(pass number, rows read of each row group in it) after `step` global steps."""
        p, j = self.locate(step, reading=False)
        counts = dict(self.start) if p == 0 else {}
        segs, _ = self.segments(p)
        left = j * self.batch
        for g, a, n in segs:
            if left <= 0:
                break
            m = min(left, n)
            counts[g] = a + m
            left -= m
        return self.epoch + p, counts

    def record(self, step: int, identities: dict[str, dict], key: str | None) -> dict:
        """The checkpoint's `data_position` after `step` steps; identities: file_identity per path."""
        epoch, counts = self.read_so_far(step)
        files: dict[str, dict] = {}
        for ref in self.groups:
            entry = files.setdefault(ref.path, {**identities[ref.path], "period": ref.period, "rows": 0, "read": {}})
            entry["rows"] += ref.rows
            if counts.get(ref.group):
                entry["read"][str(ref.index)] = counts[ref.group]
        by_group = {ref.group: ref for ref in self.groups}
        start: dict[str, dict[str, int]] = {}
        for g, n in self.start.items():
            if n:
                start.setdefault(by_group[g].path, {})[str(by_group[g].index)] = n
        return {
            "version": POSITION_VERSION,
            "key": key,
            "step": step,
            "epoch": epoch,
            "files": list(files.values()),
            "stream": {"base_step": self.base_step, "epoch": self.epoch, "start": start},
        }


def changed_files(record: dict, identities: dict[str, dict], window_paths: set[str], in_window) -> str | None:
    """Why the files recorded in a checkpoint's `record` cannot be continued from, or None.

    Args:
        record: the checkpoint's data position.
        identities: `file_identity` of every current file of the dataset, by path.
        window_paths: the current window's files.
        in_window: in_window(period) says whether a period lies in the current window (a recorded
            file of a period outside it may be gone: the window slid past it).

    Returns:
        One line naming a recorded file that is gone or changed, or None.
    """
    for f in record.get("files", []):
        now = identities.get(f["path"])
        if now is None:
            if f["path"] in window_paths or in_window(f.get("period")):
                return f"{f['path']} was read by this run (period {f.get('period')}) and is gone"
            continue
        if now["size"] != f["size"] or now["footer_sha256"] != f["footer_sha256"]:
            how = f"size {f['size']} -> {now['size']}" if now["size"] != f["size"] else "its Parquet footer differs"
            return f"{f['path']} changed since it was read by this run ({how})"
    return None


def continued_stream(
    record: dict, step: int, refs: list[GroupRef], batch: int, seed: int, shuffle: bool, keyed: bool
) -> tuple[Stream, bool]:
    """The stream from a checkpoint's `record` at `step` over the current window `refs`.

    The recorded stream itself where the window holds the same files (an exact resume), else a new
    one from `step` over the rows not read yet in the recorded pass (new files: all their rows).

    Returns:
        (the stream, whether it is a continuation over other files).
    """
    recorded = {f["path"] for f in record["files"]}
    now = {ref.path for ref in refs}
    where = {(ref.path, ref.index): ref.group for ref in refs}
    if recorded == now:
        s = record["stream"]
        start = {where[(p, int(i))]: n for p, rows in s["start"].items() for i, n in rows.items()}
        return Stream(refs, batch, seed, shuffle, int(s["base_step"]), int(s["epoch"]), start, keyed), False
    start = {}
    for f in record["files"]:
        for i, n in f["read"].items():
            if (f["path"], int(i)) in where:
                start[where[(f["path"], int(i))]] = int(n)
    return Stream(refs, batch, seed, shuffle, step, int(record["epoch"]), start, keyed), True
