"""Check preprocessed Criteo before training: the files are untrusted until verified here.

`load_manifest(dir)` parses manifest.json and checks its structure. `verify_days(...)` checks days:
each `.npy` header is parsed without pickle (dtype, shape, C order, file size), the three files
have the manifest's row count, labels are 0 or 1, every sparse id c is in [0, rows of the table
that column c feeds), dense values are finite, and (optionally) each file's sha256 equals the
manifest's. Files are read once, in chunks of `chunk_bytes` (bounded memory, vectorised), so a
day of any size can be verified; the checksum is computed in the same pass.
Every refusal is a `CriteoDataError` naming the file (and row/column) and the fix.

Under torchrun the content scans run once per node and job, not once per rank: the first rank of
the node to arrive scans while the others wait on a lock, then they find its stamp and skip them
(`_once_per_node`). The stamp is keyed by the job (TORCHELASTIC_RUN_ID) and by every file's
identity (path, size, mtime, inode), so another job, or a changed file, is scanned again.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dlrm.data.criteo.format import KINDS, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, CriteoDataError, day_paths

COLS = {"dense": NUM_DENSE, "sparse": NUM_SPARSE, "labels": 1}
DTYPES = {"dense": ("<f4",), "sparse": ("<i4", "<i8"), "labels": ("<i4",)}
RERUN = "re-run `python -m dlrm.data.criteo.preprocess --out DIR ...` (with --force) to rewrite it"
CHUNK_BYTES = 32 << 20


@dataclass(frozen=True)
class NpyHeader:
    """What a .npy header says: dtype, shape and where the data start (bytes)."""

    dtype: np.dtype
    shape: tuple
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_npy_header(path: str, kind: str) -> NpyHeader:
    """Parse `path`'s header with numpy's literal parser (no pickle, no code) and check it for `kind`.

    Refuses: a bad magic or header, another dtype than DTYPES[kind], Fortran order, a shape other
    than [rows, COLS[kind]], and a file size that disagrees with the header (truncated or padded).
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version} (only 1.0 and 2.0 hold plain arrays)")
            offset = f.tell()
    except OSError as e:
        raise CriteoDataError(
            f"{path} cannot be read ({e.strerror or e}); check the file and its permissions"
        ) from None
    except Exception as e:  # numpy's header parser raises ValueError, SyntaxError, tokenize.TokenError, ...
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]  # numpy's first line, not its advice
        raise CriteoDataError(f"{path} is not a valid .npy file ({reason}); {RERUN}") from None
    if dtype.str not in DTYPES[kind] or dtype.hasobject:
        raise CriteoDataError(
            f"{path} holds dtype {dtype.str!r} but {kind} must be {' or '.join(DTYPES[kind])} "
            f"(little-endian, as dlrm.data.criteo.preprocess writes it); {RERUN}"
        )
    if fortran:
        raise CriteoDataError(f"{path} is stored in Fortran (column-major) order; rows must be contiguous: {RERUN}")
    if len(shape) != 2 or shape[1] != COLS[kind]:
        raise CriteoDataError(f"{path} has shape {list(shape)} but {kind} must be [rows, {COLS[kind]}]; {RERUN}")
    head = NpyHeader(dtype, tuple(int(s) for s in shape), offset)
    size = os.path.getsize(path)
    if size != offset + head.nbytes:
        what = "truncated" if size < offset + head.nbytes else "longer than its header says"
        raise CriteoDataError(
            f"{path} is {size} bytes but its header ({dtype.str} {list(shape)}) needs {offset + head.nbytes}: "
            f"the file is {what}; {RERUN}"
        )
    return head


def open_npy(path: str, head: NpyHeader) -> np.ndarray:
    """The array of a verified header, memory-mapped read-only."""
    return np.memmap(path, dtype=head.dtype, mode="r", offset=head.offset, shape=head.shape)


# ---------------------------------------------------------------- manifest.json
def _need(cond: bool, path: str, what: str) -> None:
    if not cond:
        raise CriteoDataError(f"{path} is corrupt: {what}; {RERUN}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def load_manifest(directory: str) -> dict:
    """manifest.json of a finished preprocessing run, its structure checked (days, rows, files)."""
    path = os.path.join(directory, "manifest.json")
    if not os.path.isfile(path):
        raise CriteoDataError(
            f"{path} not found: data.criteo.dir must be the --out directory of a finished "
            f"`python -m dlrm.data.criteo.preprocess --out {directory} ...` run"
        )
    try:
        with open(path, "rb") as f:
            m = json.loads(f.read(64 << 20).decode("utf-8"))
    except OSError as e:
        raise CriteoDataError(
            f"{path} cannot be read ({e.strerror or e}); check the file and its permissions"
        ) from None
    except (ValueError, RecursionError) as e:
        raise CriteoDataError(f"{path} is not valid JSON ({str(e).splitlines()[0][:120]}); {RERUN}") from None
    _need(isinstance(m, dict) and isinstance(m.get("days"), list), path, "no list 'days'")
    _need(m.get("sparse_dtype") in ("int32", "int64"), path, f"sparse_dtype {m.get('sparse_dtype')!r}")
    seen = set()
    for i, d in enumerate(m["days"]):
        _need(isinstance(d, dict), path, f"days[{i}] is not an object")
        _need(_is_int(d.get("day")) and d["day"] >= 0, path, f"days[{i}].day = {d.get('day')!r}")
        _need(d["day"] not in seen, path, f"day {d['day']} is listed twice")
        seen.add(d["day"])
        _need(_is_int(d.get("rows")) and d["rows"] >= 0, path, f"days[{i}].rows = {d.get('rows')!r}")
        files = d.get("files")
        _need(isinstance(files, dict) and set(KINDS) <= set(files), path, f"days[{i}].files lacks {list(KINDS)}")
        for k in KINDS:
            f = files[k]
            _need(isinstance(f, dict), path, f"days[{i}].files.{k} is not an object")
            _need(_is_int(f.get("bytes")), path, f"days[{i}].files.{k}.bytes = {f.get('bytes')!r}")
            digest = f.get("sha256")
            ok = isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
            _need(ok, path, f"days[{i}].files.{k}.sha256 = {digest!r}")
    return m


# ---------------------------------------------------------------- one day's three files
def _col_max(x: np.ndarray, k: int = 64) -> np.ndarray:
    """Max of each column of x [n, c]; rows are folded k at a time into wide rows (faster than max(0))."""
    n, c = x.shape
    m = n - n % k
    out = x[:m].reshape(-1, c * k).max(0).reshape(k, c).max(0) if m else np.zeros(c, x.dtype)
    return np.maximum(out, x[m:].max(0)) if m < n else out


def _scan(
    path: str, head: NpyHeader, sha256: str | None, check: Callable[[np.ndarray, int], None], chunk_bytes: int
) -> None:
    """Read `path` once, `chunk_bytes` at a time: check(rows [n, cols], first row) and hash the bytes.

    With `sha256`, the checksum is decided before the content: a check's refusal waits until the whole
    file is hashed, and a file that differs from the manifest is refused for that (a corrupt copy),
    not for what the damage looks like (an id beyond its table, which would blame the table size)."""
    h = hashlib.sha256() if sha256 else None
    rows, cols = head.shape
    row_bytes = cols * head.dtype.itemsize
    per = max(1, chunk_bytes // max(1, row_bytes))
    buf = bytearray(min(per, max(rows, 1)) * row_bytes)
    refused: CriteoDataError | None = None
    with open(path, "rb") as f:
        header = f.read(head.offset)
        if h:
            h.update(header)
        start = 0
        while start < rows:
            n = min(per, rows - start)
            view = memoryview(buf)[: n * row_bytes]
            got = 0
            while got < len(view):
                k = f.readinto(view[got:])
                if not k:
                    raise CriteoDataError(f"{path} shrank while it was being verified; is another job writing it?")
                got += k
            if h:
                h.update(view)
            if refused is None:
                try:
                    check(np.frombuffer(view, head.dtype).reshape(n, cols), start)
                except CriteoDataError as e:
                    if not h:
                        raise
                    refused = e  # said once the checksum is known to match
            start += n
    if h and h.hexdigest() != sha256:
        raise CriteoDataError(
            f"{path}: sha256 {h.hexdigest()} differs from manifest.json's {sha256}: the file changed after "
            f"preprocessing (a corrupt copy or disk, or another tool). Fix: copy the directory again or {RERUN}; "
            f"data.criteo.verify_checksums=false skips only this check"
        )
    if refused is not None:
        raise refused


def day_headers(directory: str, meta: dict, sparse_dtype: str) -> dict[str, NpyHeader]:
    """The cheap checks of one day (no data read): files present, headers valid, rows and sizes as listed."""
    day, rows = meta["day"], meta["rows"]
    heads: dict[str, NpyHeader] = {}
    for k, p in day_paths(directory, day).items():
        if not os.path.isfile(p):
            raise CriteoDataError(f"{p} is missing although manifest.json lists day {day}; {RERUN}")
        heads[k] = read_npy_header(p, k)
        if heads[k].shape[0] != rows:
            raise CriteoDataError(
                f"{p} has {heads[k].shape[0]} rows but manifest.json says day {day} has {rows}; {RERUN}"
            )
        want = meta["files"][k]["bytes"]
        if os.path.getsize(p) != want:
            raise CriteoDataError(f"{p} is {os.path.getsize(p)} bytes but manifest.json says {want}; {RERUN}")
        if k == "sparse" and heads[k].dtype != np.dtype(sparse_dtype):
            raise CriteoDataError(f"{p} holds {heads[k].dtype} ids but manifest.json says {sparse_dtype}; {RERUN}")
    return heads


def day_scans(
    directory: str,
    meta: dict,
    heads: dict[str, NpyHeader],
    feature_names: Sequence[str],
    table_rows: Sequence[int],
    checksums: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> list[Callable[[], None]]:
    """One scan per file of the day (labels, sparse, dense), each raising CriteoDataError on bad content.

    Args:
        meta: the day's entry of the manifest.
        heads: {kind: its verified header} (`day_headers`).
        feature_names: feature_names[c] is sparse column C{c+1}'s feature (for messages).
        table_rows: table_rows[c] is the rows of the table serving column C{c+1}.
        checksums: also compare each file's sha256 with the manifest's.
    """
    paths = day_paths(directory, meta["day"])
    limit = np.asarray(table_rows, np.int64)
    # Ids are compared as unsigned: a negative id becomes >= 2^31 (int32) or 2^63 (int64), beyond any limit.
    unsigned = np.dtype(heads["sparse"].dtype.str.replace("i", "u"))
    ulimit = np.minimum(limit, 2 ** (8 * unsigned.itemsize - 1)).astype(unsigned)

    def labels(x: np.ndarray, first: int) -> None:
        if _col_max(x.view("<u4"))[0] > 1:
            r = int(np.flatnonzero((x[:, 0] < 0) | (x[:, 0] > 1))[0])
            raise CriteoDataError(
                f"{paths['labels']}, row {first + r}: label {int(x[r, 0])}, but labels must be 0 or 1; {RERUN}"
            )

    def sparse(x: np.ndarray, first: int) -> None:
        bad = np.flatnonzero(_col_max(x.view(unsigned)) >= ulimit)
        if len(bad):
            c = int(bad[0])
            r = int(np.flatnonzero((x[:, c] < 0) | (x[:, c] >= limit[c]))[0])
            v, name = int(x[r, c]), feature_names[c]
            where = f"{paths['sparse']}, row {first + r}: sparse column {SPARSE_NAMES[c]} (feature '{name}') has id {v}"
            if v < 0:
                raise CriteoDataError(f"{where}; ids must be >= 0: the file is corrupt; {RERUN}")
            raise CriteoDataError(
                f"{where}, but the table serving '{name}' has only {limit[c]} rows. Fix: give that table at least "
                f"{v + 1} rows in the model config, or re-run "
                f"`python -m dlrm.data.criteo.preprocess --table-sizes ...` "
                f"with the model's table sizes so ids are hashed into them"
            )

    def dense(x: np.ndarray, first: int) -> None:
        if not (np.isfinite(x.min()) and np.isfinite(x.max())):  # min and max propagate NaN
            r, c = (int(i) for i in np.argwhere(~np.isfinite(x))[0])
            raise CriteoDataError(
                f"{paths['dense']}, row {first + r}, column I{c + 1}: dense value {x[r, c]}, but dense features "
                f"must be finite (preprocessing writes log(1 + max(x, 0))): the file is corrupt; {RERUN}"
            )

    checks = {"labels": labels, "sparse": sparse, "dense": dense}
    return [
        functools.partial(
            _scan, paths[k], heads[k], meta["files"][k]["sha256"] if checksums else None, checks[k], chunk_bytes
        )
        for k in KINDS
    ]


def verify_days(
    directory: str,
    manifest: dict,
    days: list[int],
    feature_names: Sequence[str],
    table_rows: Sequence[int],
    checksums: bool = True,
    threads: int | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[int, dict[str, np.ndarray]]:
    """Verify `days` of a manifest: all headers first, then the content scans, on several threads.

    Args:
        manifest: a `load_manifest` result.
        feature_names: feature_names[c] is sparse column C{c+1}'s feature.
        table_rows: table_rows[c] is the rows of the table serving column C{c+1}.
        checksums: also compare each file's sha256 with the manifest's.
        threads: scan threads; None: one per CPU, at most 8.
        report: given, gets one line saying what was verified and how long it took.

    Returns:
        {day: {kind: array [rows, cols], memory-mapped read-only}}.

    Raises:
        CriteoDataError: the first bad file, naming it (and the row and column) and the fix.
    """
    metas = {d["day"]: d for d in manifest["days"]}
    heads = {d: day_headers(directory, metas[d], manifest["sparse_dtype"]) for d in days}
    paths = [p for d in days for p in day_paths(directory, d).values()]
    what = f"{len(days)} day(s) of {directory} ({sum(os.path.getsize(p) for p in paths) / 2**30:.2f} GiB"
    what += ", with sha256)" if checksums else ")"

    def scan() -> None:
        scans = [
            f for d in days for f in day_scans(directory, metas[d], heads[d], feature_names, table_rows, checksums)
        ]
        workers = max(1, min(len(scans), threads or min(os.cpu_count() or 1, 8)))
        with ThreadPoolExecutor(workers, thread_name_prefix="verify") as pool:
            for done in [pool.submit(f) for f in scans]:
                done.result()  # the first failure, in file order

    identity = [json.dumps([directory, days, list(feature_names), list(table_rows), checksums]), *paths]
    _once_per_node(scan, what, identity, report or (lambda line: None))
    return {d: {k: open_npy(p, heads[d][k]) for k, p in day_paths(directory, d).items()} for d in days}


def _own_stamp(path: str) -> bool:
    """Whether `path` is a stamp this user wrote: a regular file (not a planted symlink) owned by us."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def _once_per_node(scan: Callable[[], None], what: str, identity: list[str], report: Callable[[str], None]) -> None:
    """scan() unless another rank of this node already did it in this job (a stamp under a lock).

    `identity`: a description of the check, then the files' paths. Outside torchrun, scan() always.
    `report` gets the line saying which it was and how long it took.
    """
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if job is None or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) < 2:
        start = time.perf_counter()
        scan()
        report(f"data: verified {what} in {time.perf_counter() - start:.1f}s")
        return
    key = hashlib.sha256(job.encode())
    for item in identity:
        key.update(item.encode())
        if os.path.exists(item):
            st = os.stat(item)
            key.update(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode())
    base = os.path.join(tempfile.gettempdir(), f"dlrm-verified-{key.hexdigest()[:32]}")
    fd = os.open(base + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one rank of the node scans; the others wait here
        if _own_stamp(base + ".ok"):
            report(f"data: {what} verified by another rank of this node")
            return
        start = time.perf_counter()
        scan()  # a failure leaves no stamp: every rank then scans, and fails alike
        with open(base + ".ok", "x"):
            pass
        report(f"data: verified {what} in {time.perf_counter() - start:.1f}s (once for this node's ranks)")
    finally:
        os.close(fd)
