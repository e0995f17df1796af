"""Criteo TSV reading and conversion to TorchRec's binary layout (the core of `dlrm.data.preprocess`).

Input: `label \\t I1..I13 \\t C1..C26`, one example per line; empty = missing; dense may be negative;
categorical ids are hex. Plain or gzip.

Output, per input file i (the layout of `torchrec.datasets.criteo.BinaryCriteoUtils`):
    day_{i}_dense.npy   float32 [N, 13]  log(1 + max(x, 0)), missing -> 0
    day_{i}_sparse.npy  int32|int64 [N, 26]  int(hex, 16), then `% table_size` with id_map=modulo; missing -> 0
    day_{i}_labels.npy  int32 [N, 1]
Parsing is vectorised over blocks of lines (numpy only): memory stays bounded by the block size.
"""

from __future__ import annotations

from dlrm.errors import UserError
import gzip
import hashlib
import os
import queue
import threading
import zlib
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
FIELD_NAMES = ["label"] + [f"I{i + 1}" for i in range(NUM_DENSE)] + [f"C{i + 1}" for i in range(NUM_SPARSE)]
SPARSE_NAMES = FIELD_NAMES[1 + NUM_DENSE :]
DENSE_TRANSFORM = "log(1 + max(x, 0)) in float32; missing -> 0"
KINDS = ("dense", "sparse", "labels")

# Table sizes of the DLRM paper's Kaggle model (ids remapped to contiguous, as in facebookresearch/dlrm).
KAGGLE_TABLE_SIZES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
# MLPerf DLRM-DCNv2 on Criteo 1TB (ids hashed into at most 40M rows).
TB_TABLE_SIZES = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]  # fmt: skip
MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]

_HEX = np.full(256, 255, np.uint8)  # byte -> hex digit value; 255 = not a hex digit
for _i, _c in enumerate(b"0123456789"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"abcdef"):
    _HEX[_c] = _HEX[_c - 32] = 10 + _i
_MAX_DEC_DIGITS = 18  # fits int64
_MAX_HEX_DIGITS = 16  # fits uint64
_PAD = 32  # zero bytes before the block, so every fixed-width window ending at a field end is in bounds


class CriteoFormatError(UserError, ValueError):
    """Bad input under policy `fail`; the message names file, line, field, value and the fix."""


class CriteoDataError(UserError, ValueError):
    """Preprocessed data or preprocessing arguments that cannot be used; the message names the file and the fix."""

    same_on_all_ranks = True  # every rank verifies the same files before training


@dataclass(frozen=True)
class ParseOptions:
    """policy: fail | skip. id_map: modulo (id % table size) | none (raw id, checked < table size).

    shuffle_seed: if set, the rows of day i are permuted by a (shuffle_seed, i)-seeded permutation.
    """

    policy: str = "fail"
    id_map: str = "none"
    table_sizes: Optional[Tuple[int, ...]] = None
    shuffle_seed: Optional[int] = None

    def __post_init__(self):
        if self.policy not in ("fail", "skip"):
            raise ValueError(f"policy {self.policy!r}: use fail or skip")
        if self.id_map not in ("modulo", "none"):
            raise ValueError(f"id_map {self.id_map!r}: use modulo or none")
        if self.table_sizes is not None:
            if len(self.table_sizes) != NUM_SPARSE or not all(1 <= int(s) < 2**63 for s in self.table_sizes):
                raise ValueError(
                    f"--table-sizes needs {NUM_SPARSE} sizes in [1, 2^63), got {list(self.table_sizes)}"
                )
        elif self.id_map == "modulo":
            raise ValueError("id_map=modulo needs table_sizes (--table-sizes)")
        if self.shuffle_seed is not None and self.shuffle_seed < 0:
            raise ValueError(f"--shuffle-seed {self.shuffle_seed}: give a seed >= 0")

    @property
    def sparse_dtype(self) -> np.dtype:
        """int32 when every id is known to fit (table sizes <= 2^31), else int64."""
        if self.table_sizes is not None and max(self.table_sizes) <= 2**31:
            return np.dtype(np.int32)
        return np.dtype(np.int64)


@dataclass
class BadLine:
    line: int  # 1-based line number in the input file
    field: str
    value: str
    reason: str

    def describe(self, path: str) -> str:
        return f"{path}, line {self.line}, field {self.field}: {self.reason} (value {self.value!r})"


@dataclass
class Parsed:
    """One block of lines. dense float32 [n, 13], sparse [n, 26], labels int32 [n, 1]."""

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray
    lines: int
    bad: List[BadLine] = field(default_factory=list)  # all bad lines of the block, in order


_U64 = np.dtype("<u8")


def _bytes8(b: int) -> np.uint64:
    """The byte b repeated in all 8 bytes of a uint64."""
    return np.uint64(b * 0x0101010101010101)


_HIGH, _LOW, _ASCII = _bytes8(0x80), _bytes8(0x0F), _bytes8(0x7F)
# _KEEP[n]: of the 8 bytes gathered before a field end (byte k = the k-th of them), keep the last n.
_KEEP = np.array([((1 << 64) - 1) << (8 * (8 - n)) & ((1 << 64) - 1) for n in range(9)], np.uint64)


def _words(ap: np.ndarray) -> np.ndarray:
    """uint64 view of `ap` at every byte offset (unaligned, stride 1): words[p] = bytes p..p+7."""
    return np.ndarray(buffer=ap, dtype=_U64, shape=(len(ap) - 7,), strides=(1,))


def _in_range(y: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Per byte of y (all bytes < 0x80): 0x80 where lo <= byte <= hi, else 0. No carries cross bytes."""
    return ~(y + _bytes8(0x7F - hi)) & (y + _bytes8(0x80 - lo)) & _HIGH


def _fold_hex(x: np.ndarray) -> np.ndarray:
    """uint64 holding 8 nibbles (byte 0 = most significant digit) -> their hex value."""
    u = np.uint64
    x = ((x & u(0x0F000F000F000F00)) >> u(8)) | ((x & u(0x000F000F000F000F)) << u(4))
    x = ((x & u(0x00FF000000FF0000)) >> u(16)) | ((x & u(0x000000FF000000FF)) << u(8))
    return ((x & u(0x0000FFFF00000000)) >> u(32)) | ((x & u(0x000000000000FFFF)) << u(16))


def _fold_dec(x: np.ndarray) -> np.ndarray:
    """uint64 holding 8 decimal digits (byte 0 = most significant) -> their value."""
    u = np.uint64
    x = (x & u(0x00FF00FF00FF00FF)) * u(10) + ((x >> u(8)) & u(0x00FF00FF00FF00FF))
    x = (x & u(0x0000FFFF0000FFFF)) * u(100) + ((x >> u(16)) & u(0x0000FFFF0000FFFF))
    return (x & u(0x00000000FFFFFFFF)) * u(10000) + (x >> u(32))


def _parse_wide(ap: np.ndarray, fs: np.ndarray, fe: np.ndarray, signed: bool):
    """The few fields longer than 8 digits (1-D fs, fe), digit by digit. Returns (value, bad)."""
    max_w = _MAX_DEC_DIGITS if signed else _MAX_HEX_DIGITS
    neg = signed & (ap[fs] == ord("-"))
    n = fe - fs - neg
    w = int(min(n.max(), max_w))
    k = np.arange(w)
    digits = np.where(k >= (w - n)[:, None], _HEX[np.lib.stride_tricks.sliding_window_view(ap, w)[fe - w]], 0)
    bad = (digits >= (10 if signed else 16)).any(-1) | (n > max_w)
    if signed:
        value = np.where(neg, -1, 1) * (digits.astype(np.int64) @ (10 ** (w - 1 - k)).astype(np.int64))
    else:
        value = digits.astype(np.uint64) @ (np.uint64(16) ** (w - 1 - k).astype(np.uint64))
    return value, bad


def _parse_fields(ap: np.ndarray, fs: np.ndarray, fe: np.ndarray, signed: bool):
    """Parse integer fields [fs, fe) (shape [m, F]) of the padded bytes `ap`.

    Decimal with an optional '-' (signed=True, int64) or hex (uint64). Returns (value [m, F], bad [m, F]);
    empty fields are 0. The last 8 chars of every field are read as one uint64, checked and folded into a
    number with a few shifts and adds per word (SWAR), so all work is vectorised; longer fields are redone.
    """
    length = fe - fs
    neg = (length > 0) & (ap[fs] == ord("-")) if signed else np.zeros(length.shape, bool)
    n = length - neg
    keep = _KEEP[np.minimum(n, 8)]
    x = _words(ap)[fe - 8] & keep  # bytes before the field become 0
    y = x & _ASCII
    digit = _in_range(y, 0x30, 0x39)
    if signed:
        bad_bits = ~digit
        value = _fold_dec(y & _LOW).astype(np.int64)
        value = np.where(neg, -value, value)
    else:
        alpha = _in_range(y | _bytes8(0x20), 0x61, 0x66)  # a-f or A-F
        bad_bits = ~(digit | alpha)
        value = _fold_hex((y & _LOW) + (alpha >> np.uint64(7)) * np.uint64(9))
    bad_bits |= x  # bytes >= 0x80
    bad_bits &= keep & _HIGH  # only the field's own bytes count
    bad = bad_bits != 0
    if signed:
        bad |= neg & (n == 0)
    wide = n > 8
    if wide.any():
        value[wide], bad[wide] = _parse_wide(ap, fs[wide], fe[wide], signed)
    return value, bad


def parse_block(buf: bytes, opts: ParseOptions, first_line: int = 1) -> Parsed:
    """Parse complete lines (`buf` must end with '\\n'); first_line is the number of its first line.

    Every bad line is returned in `bad` (and left out of the arrays); the caller applies the policy.
    """
    a = np.frombuffer(buf, np.uint8)
    ap = np.concatenate([np.zeros(_PAD, np.uint8), a])
    sep = np.flatnonzero(a < 11)  # tabs and newlines (and other control bytes, which make the check fail)
    kind = a[sep]
    bad: List[BadLine] = []
    n = len(sep) // NUM_FIELDS
    if (
        n
        and len(sep) == n * NUM_FIELDS
        and (kind[NUM_FIELDS - 1 :: NUM_FIELDS] == 10).all()
        and (kind == 10).sum() == n
        and (kind >= 9).all()
    ):
        # fast path: every line has exactly 39 tabs (every 40th separator, and only those, is a newline)
        fe = sep.reshape(n, NUM_FIELDS)
        good = np.arange(n)
        line_start = np.concatenate([[0], fe[:-1, -1] + 1])
    else:
        nl = np.flatnonzero(a == 10)
        n = len(nl)
        starts = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)
        tabs = np.flatnonzero(a == 9)
        ntabs = np.bincount(np.searchsorted(nl, tabs), minlength=n)[:n]
        ok = ntabs == NUM_FIELDS - 1
        for i in np.flatnonzero(~ok):
            text = buf[starts[i] : nl[i]].decode("utf-8", "replace")
            reason = "empty line" if not text else f"{ntabs[i] + 1} tab-separated fields, expected {NUM_FIELDS}"
            bad.append(BadLine(first_line + int(i), "line", text[:80], reason))
        good = np.flatnonzero(ok)
        fe = np.empty((len(good), NUM_FIELDS), np.int64)
        fe[:, :-1] = tabs[np.repeat(ok, ntabs)].reshape(-1, NUM_FIELDS - 1)
        fe[:, -1] = nl[good]
        line_start = starts[good]
    fs = np.empty_like(fe)
    fs[:, 1:] = fe[:, :-1] + 1
    fs[:, 0] = line_start
    fs += _PAD
    fe = fe + _PAD

    label_len = fe[:, 0] - fs[:, 0]
    label = ap[fs[:, 0]].astype(np.int32) - ord("0")
    label_bad = (label_len != 1) | (label < 0) | (label > 1)
    dval, dbad = _parse_fields(ap, fs[:, 1 : 1 + NUM_DENSE], fe[:, 1 : 1 + NUM_DENSE], True)
    sval, sbad = _parse_fields(ap, fs[:, 1 + NUM_DENSE :], fe[:, 1 + NUM_DENSE :], False)
    range_bad = np.zeros_like(sbad)
    if opts.table_sizes is not None:
        sizes = np.asarray(opts.table_sizes, np.uint64)
        if opts.id_map == "modulo":
            sval = sval % sizes
        else:
            range_bad = sval >= sizes
    elif opts.sparse_dtype == np.int64:
        range_bad = sval >= np.uint64(2**63)
    field_bad = np.concatenate([label_bad[:, None], dbad, sbad | range_bad], axis=1)
    line_bad = field_bad.any(1)
    for j in np.flatnonzero(line_bad):
        f = int(np.argmax(field_bad[j]))
        value = bytes(ap[fs[j, f] : fe[j, f]]).decode("utf-8", "replace")
        if f == 0:
            reason = "label must be 0 or 1"
        elif f <= NUM_DENSE:
            too_long = fe[j, f] - fs[j, f] > _MAX_DEC_DIGITS
            reason = "dense value too long" if too_long else "dense value is not a decimal integer"
        elif sbad[j, f - 1 - NUM_DENSE]:
            reason = "categorical value is not a hexadecimal id of at most 16 digits"
        else:
            size = opts.table_sizes[f - 1 - NUM_DENSE] if opts.table_sizes else 2**63
            value_id = int(sval[j, f - 1 - NUM_DENSE])
            reason = f"id {value_id} is outside the table of {size} rows and no hashing is configured"
        bad.append(BadLine(first_line + int(good[j]), FIELD_NAMES[f], value[:80], reason))
    bad.sort(key=lambda b: b.line)
    keep = ~line_bad
    dense = np.log1p(np.maximum(dval[keep], 0).astype(np.float64)).astype(np.float32)
    return Parsed(
        dense=dense,
        sparse=sval[keep].astype(opts.sparse_dtype),
        labels=label[keep].reshape(-1, 1).astype(np.int32),
        lines=n,
        bad=bad,
    )


# ---------------------------------------------------------------- .npy files written in a stream
_NPY_HEADER = 128


def npy_header(dtype: np.dtype, shape: Tuple[int, ...]) -> bytes:
    """A version-1.0 .npy header of fixed length 128 bytes (so it can be rewritten in place)."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    d = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    d = d.ljust(_NPY_HEADER - 10 - 1) + "\n"
    assert len(d) == _NPY_HEADER - 10, "npy header too long"
    return b"\x93NUMPY\x01\x00" + len(d).to_bytes(2, "little") + d.encode("latin1")


class NpyWriter:
    """Append rows to a .npy file without knowing the final row count; `close` writes the shape."""

    def __init__(self, path: str, dtype, cols: int):
        self.path, self.dtype, self.cols, self.rows = path, np.dtype(dtype), cols, 0
        self._f = open(path, "wb")
        self._f.write(npy_header(self.dtype, (0, cols)))

    def append(self, arr: np.ndarray) -> None:
        assert arr.dtype == self.dtype and arr.ndim == 2 and arr.shape[1] == self.cols, (arr.dtype, arr.shape)
        self._f.write(np.ascontiguousarray(arr).data)
        self.rows += arr.shape[0]

    def close(self) -> None:
        self._f.seek(0)
        self._f.write(npy_header(self.dtype, (self.rows, self.cols)))
        self._f.close()


def sha256_file(path: str, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- converting one byte range of a file
@dataclass
class RangeTask:
    """Convert the lines starting in bytes [start, end) of `path` (end=None: to the end; gzip: whole file)."""

    path: str
    part_prefix: str  # output files are f"{part_prefix}_{kind}.npy"
    start: int = 0
    end: Optional[int] = None
    opts: ParseOptions = field(default_factory=ParseOptions)
    block_bytes: int = 8 << 20


@dataclass
class RangeResult:
    task: RangeTask
    rows: int = 0
    lines: int = 0
    skipped: int = 0
    truncated: bool = False
    bad: List[BadLine] = field(default_factory=list)  # the first few, line numbers local to the range
    max_ids: List[int] = field(default_factory=lambda: [-1] * NUM_SPARSE)
    partial: Optional[BadLine] = None  # the cut-off last line of a truncated gzip stream
    error: Optional[BadLine] = None  # policy fail: the first bad line (local numbering)
    fatal: Optional[str] = None  # an unreadable stream under policy fail


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


_progress = None  # multiprocessing.Array('q', 2): [input bytes consumed, lines parsed], shared with the parent


def set_progress_counter(counter) -> None:
    global _progress
    _progress = counter


def _report(nbytes: int = 0, nlines: int = 0) -> None:
    if _progress is not None and (nbytes or nlines):
        with _progress.get_lock():
            _progress[0] += nbytes
            _progress[1] += nlines


def _fill(read, n: int) -> Tuple[bytes, Optional[BaseException]]:
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


_DONE = object()


def read_ahead(items: Iterator, depth: int) -> Iterator:
    """Run `items` in a background thread, `depth` ahead; errors are re-raised in the consumer."""
    q: "queue.Queue" = queue.Queue(depth)
    stop = threading.Event()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def work():
        try:
            for x in items:
                if not put(x):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer
            put(e)

    thread = threading.Thread(target=work, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            x = q.get()
            if x is _DONE:
                return
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()


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
            blocks = read_ahead(blocks, 2)  # decompress (zlib frees the GIL) while the last block is parsed
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


def concat_parts(part_paths: Sequence[str], out_path: str, dtype, cols: int) -> Tuple[int, str]:
    """Concatenate streamed part .npy files into `out_path`; returns (rows, sha256 of the file)."""
    if len(part_paths) == 1:
        os.replace(part_paths[0], out_path)
        rows = np.load(out_path, mmap_mode="r").shape[0]
        return rows, sha256_file(out_path)
    rows = sum(np.load(p, mmap_mode="r").shape[0] for p in part_paths)
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        head = npy_header(np.dtype(dtype), (rows, cols))
        out.write(head)
        h.update(head)
        for p in part_paths:
            with open(p, "rb") as f:
                f.seek(_NPY_HEADER)
                while chunk := f.read(1 << 22):
                    out.write(chunk)
                    h.update(chunk)
            os.remove(p)
    return rows, h.hexdigest()


def shuffle_rows(paths: Dict[str, str], seed: int, day: int, block_rows: int = 1 << 18) -> None:
    """Permute the rows of a day's .npy files in place (same permutation for all), block by block.

    Reads the source memory-mapped, so memory is bounded by the permutation (8 bytes a row) and a block.
    """
    rows = np.load(paths["labels"], mmap_mode="r").shape[0]
    perm = np.random.default_rng([seed, day]).permutation(rows)
    for path in paths.values():
        src = np.load(path, mmap_mode="r")
        out = NpyWriter(path + ".shuffled", src.dtype, src.shape[1])
        for i in range(0, rows, block_rows):
            idx = perm[i : i + block_rows]
            order = np.argsort(idx)  # read in file order, write in permuted order
            block = np.empty((len(idx), src.shape[1]), src.dtype)
            block[order] = src[idx[order]]
            out.append(block)
        out.close()
        del src
        os.replace(path + ".shuffled", path)


class IdCounter:
    """Counts of the ids of one sparse column, fed block by block (memory ~ 16 bytes per distinct id)."""

    def __init__(self):
        self.parts: List[Tuple[np.ndarray, np.ndarray]] = []
        self.pending, self.merged = 0, 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(np.unique(ids, return_counts=True))
        self.pending += len(self.parts[-1][0])
        if self.pending > 2 * self.merged + (1 << 20):  # merge rarely: amortised O(n log n)
            self._merge()

    def _merge(self) -> None:
        ids = np.concatenate([u for u, _ in self.parts])
        counts = np.concatenate([n for _, n in self.parts])
        uniq, inverse = np.unique(ids, return_inverse=True)
        self.parts = [(uniq, np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64))]
        self.pending = self.merged = len(uniq)

    def result(self) -> Tuple[np.ndarray, np.ndarray]:
        """(sorted distinct ids, their counts)."""
        if not self.parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._merge()
        return self.parts[0]


def to_contiguous(raw: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Raw ids [n] -> rows: 1 + position in the sorted `vocab`, or 0 for ids not in it. int32 [n]."""
    if len(vocab) == 0:
        return np.zeros(len(raw), np.int32)
    idx = np.searchsorted(vocab, raw)
    found = vocab[np.minimum(idx, len(vocab) - 1)] == raw
    return np.where(found, idx + 1, 0).astype(np.int32)


def day_paths(directory: str, day: int) -> Dict[str, str]:
    return {k: os.path.join(directory, f"day_{day}_{k}.npy") for k in KINDS}
