"""The Criteo format: fields, table sizes, the output layout, and the vectorised row parser.

Input: `label \\t I1..I13 \\t C1..C26`, one example per line; empty = missing; dense may be negative;
categorical ids are hex. Plain or gzip.

Output, per input file i (the layout of `torchrec.datasets.criteo.BinaryCriteoUtils`):
    day_{i}_dense.npy   float32 [N, 13]  log(1 + max(x, 0)), missing -> 0
    day_{i}_sparse.npy  int32|int64 [N, 26]  int(hex, 16), then `% table_size` with id_map=modulo; missing -> 0
    day_{i}_labels.npy  int32 [N, 1]
Parsing is vectorised over blocks of lines (numpy only): memory stays bounded by the block size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from dlrm.common.errors import UserError

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
    table_sizes: tuple[int, ...] | None = None
    shuffle_seed: int | None = None

    def __post_init__(self):
        if self.policy not in ("fail", "skip"):
            raise ValueError(f"policy {self.policy!r}: use fail or skip")
        if self.id_map not in ("modulo", "none"):
            raise ValueError(f"id_map {self.id_map!r}: use modulo or none")
        if self.table_sizes is not None:
            if len(self.table_sizes) != NUM_SPARSE or not all(1 <= int(s) < 2**63 for s in self.table_sizes):
                raise ValueError(f"--table-sizes needs {NUM_SPARSE} sizes in [1, 2^63), got {list(self.table_sizes)}")
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
    """A line that does not parse: where, which field, its value and why."""

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
    bad: list[BadLine] = field(default_factory=list)  # all bad lines of the block, in order


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


def _field_ends(buf: bytes, a: np.ndarray, first_line: int):
    """Field end offsets [m, 40] of the m well-formed lines of `a` (the bytes of `buf`), their line
    indexes [m] and start offsets [m], the number of lines, and a BadLine for every other line."""
    sep = np.flatnonzero(a < 11)  # tabs and newlines (and other control bytes, which make the check fail)
    kind = a[sep]
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
        return fe, np.arange(n), np.concatenate([[0], fe[:-1, -1] + 1]), n, []
    nl = np.flatnonzero(a == 10)
    n = len(nl)
    starts = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64)
    tabs = np.flatnonzero(a == 9)
    ntabs = np.bincount(np.searchsorted(nl, tabs), minlength=n)[:n]
    ok = ntabs == NUM_FIELDS - 1
    bad = []
    for i in np.flatnonzero(~ok):
        text = buf[starts[i] : nl[i]].decode("utf-8", "replace")
        reason = "empty line" if not text else f"{ntabs[i] + 1} tab-separated fields, expected {NUM_FIELDS}"
        bad.append(BadLine(first_line + int(i), "line", text[:80], reason))
    good = np.flatnonzero(ok)
    fe = np.empty((len(good), NUM_FIELDS), np.int64)
    fe[:, :-1] = tabs[np.repeat(ok, ntabs)].reshape(-1, NUM_FIELDS - 1)
    fe[:, -1] = nl[good]
    return fe, good, starts[good], n, bad


def _bad_field_reason(f: int, length: int, not_hex: bool, value_id: int, opts: ParseOptions) -> str:
    """Why field f (0 label, 1..13 dense, 14..39 categorical) of a line is bad."""
    if f == 0:
        return "label must be 0 or 1"
    if f <= NUM_DENSE:
        return "dense value too long" if length > _MAX_DEC_DIGITS else "dense value is not a decimal integer"
    if not_hex:
        return "categorical value is not a hexadecimal id of at most 16 digits"
    size = opts.table_sizes[f - 1 - NUM_DENSE] if opts.table_sizes else 2**63
    return f"id {value_id} is outside the table of {size} rows and no hashing is configured"


def parse_block(buf: bytes, opts: ParseOptions, first_line: int = 1) -> Parsed:
    """Parse complete lines of Criteo TSV; never raises on bad data.

    Args:
        buf: whole lines, ending with '\\n'.
        opts: the parse options (id mapping, table sizes).
        first_line: the line number of buf's first line, for `BadLine`s.

    Returns:
        The `Parsed` block: the good lines as arrays, every bad line in `bad` (left out of the
        arrays; the caller applies the policy).
    """
    a = np.frombuffer(buf, np.uint8)
    ap = np.concatenate([np.zeros(_PAD, np.uint8), a])
    fe, good, line_start, n, bad = _field_ends(buf, a, first_line)
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
        c = max(f - 1 - NUM_DENSE, 0)
        reason = _bad_field_reason(f, int(fe[j, f] - fs[j, f]), bool(sbad[j, c]), int(sval[j, c]), opts)
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


def day_paths(directory: str, day: int) -> dict[str, str]:
    """{kind: path} of day `day`'s .npy files (dense, sparse, labels)."""
    return {k: os.path.join(directory, f"day_{day}_{k}.npy") for k in KINDS}
