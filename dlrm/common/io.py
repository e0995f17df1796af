"""Output files written atomically, and checksums: the one place every writer of the project uses.

An atomic write goes to a temporary file beside the target (same directory, so same filesystem),
is flushed to disk, then renamed over the target with `os.replace`: a reader sees the old file or
the new one, never a partial one, and a failure (exception, kill) leaves the old file untouched and
removes the temporary file (or, when killed, leaves only a dot-file named `.NAME.tmp*`). The
temporary file is created new under a random name (`tempfile.mkstemp`: O_CREAT | O_EXCL), so a file
or symlink planted at a predictable name is never opened, nor written through.

`refuse_alias` is the check that an output is none of a command's inputs; `read_bounded` the one
way to read a small file a user hands us (a manifest, a config, a benchmark's JSON), and `parse_json`
JSON that may be nested without bound.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlrm.common.errors import UserError


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path` for a writer that takes a file name (torch.save, np.save,
    savefig); on success it replaces `path`, on an exception it is removed and `path` is unchanged."""
    target = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp", dir=target.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make every output private
        os.close(fd)
        yield tmp
        publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def publish(finished: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make `finished`, a complete file beside `target` (the same filesystem), the file at `target`: its
    bytes flushed to disk, renamed over `target` in one step, the directory's entry flushed. A reader sees
    the old file or the new one; after a crash, never a renamed file whose bytes were not on disk."""
    with open(finished, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(finished, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))


def publish_dir(finished: str | os.PathLike[str], target: str | os.PathLike[str], flush_files: bool = True) -> None:
    """Make the complete directory `finished`, beside `target` (the same filesystem), the directory
    `target` (absent, or empty) in one rename: its files flushed first (`flush_files`; False where
    their writer flushed them), its entries and the parent's flushed after.

    Raises:
        OSError: `target` exists and is not empty, or the rename fails.
    """
    if flush_files:
        for f in Path(finished).rglob("*"):
            if f.is_file():
                with open(f, "rb+") as handle:
                    os.fsync(handle.fileno())
    for directory in (finished, os.path.dirname(os.path.abspath(target))):
        _fsync_dir(directory)
    os.replace(finished, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))


def _fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def refuse_alias(out: str | os.PathLike[str], flag: str, inputs: dict[str, str | os.PathLike[str]]) -> None:
    """Refuse an output that is one of a command's inputs or lies inside an input directory.

    Args:
        out: the output path, given as `flag`.
        inputs: {what: path} of the command's inputs.

    Raises:
        UserError: writing `out` would destroy what the command reads.
    """
    target = Path(out).resolve()
    for what, given in inputs.items():
        source = Path(given).resolve()
        if target == source or source in target.parents:
            raise UserError(f"{flag} {out} would overwrite {what} {given}; choose another output path")


NAME_MAX, PATH_MAX = 255, 4096  # bytes of one name, and of a path (Linux's limits)
ROOM_INSIDE = 256  # bytes an output directory's own files add to its path (checkpoints/step_*/..., tensorboard/...)


def output_dir_problem(value: str, key: str) -> str | None:
    """Why `value` cannot be an output directory (empty, a file, no writable place to create it), else None:
    checked before the work that will write there starts."""
    if not value.strip():
        return f"{key} is empty: give a directory (or leave it out for the default)"
    place = Path(value).absolute()
    shown = value if len(value) <= 60 else f"{value[:40]}..."
    long = next((part for part in place.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:
        return (
            f"{key}={shown}: a name in it ({long[:20]}...) is {len(os.fsencode(long))} bytes, beyond the "
            f"{NAME_MAX} a filesystem allows; give a shorter one"
        )
    if len(os.fsencode(str(place))) + ROOM_INSIDE > PATH_MAX:
        return (
            f"{key}={shown}: the path is {len(os.fsencode(str(place)))} bytes; with the files written "
            f"inside it, paths would pass the system's {PATH_MAX} bytes; give a shorter directory"
        )
    if place.exists() and not place.is_dir():
        return f"{key}={value} is a file, not a directory: give a directory"
    existing = next(p for p in (place, *place.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"{key}={value}: {existing} is not a writable directory; give one this user can write"
    return None


JSON_LIMIT = 64 << 20  # a results or summary JSON that a command of ours wrote: kilobytes to megabytes


class UnreadableFileError(UserError):
    """A file that is not a regular file, or larger than its format allows."""


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    Raises:
        UnreadableFileError: a FIFO, a device, a directory or a larger file (reading it would hang or
            exhaust memory). FileNotFoundError and other OSErrors pass through.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block the open
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableFileError(f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFileError(f"{path} is larger than the {limit:,} bytes such a file can hold")
    return data


def parse_json(data: bytes | str) -> Any:
    """json.loads, with nesting too deep for the parser reported as a ValueError like other bad JSON."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` as the whole content of `path`, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, indent: int = 2) -> None:
    """`obj` as indented JSON with sorted keys and a final newline, atomically."""
    write_atomic(path, (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode())


def sha256_file(path: str | os.PathLike[str], block: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in blocks of `block` bytes (bounded memory)."""
    return size_and_sha256(path, block)[1]


def size_and_sha256(path: str | os.PathLike[str], block: int = 1 << 22) -> tuple[int, str]:
    """(bytes read, hex SHA-256) of a file, from one pass in blocks of `block` bytes (bounded memory)."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def figure_png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (110 dpi, tight box); the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


class DiskFullError(UserError):
    """No space left (or the quota reached) where a command writes; the message names the path."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_in(e: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT OSError that `e` is or wraps (a cause, a context, or one of DCP's per-rank
    `failures`), else None."""
    todo: list[Any] = [e]
    seen: set[int] = set()
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen or not isinstance(x, BaseException):
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in _FULL:
            return x
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):  # DCP's CheckpointException: {rank: its wrapped exception}
            todo += [f[0] if isinstance(f, tuple) else getattr(f, "exc", f) for f in failures.values()]
        todo += [x.__cause__, x.__context__]
    return None


def tree_bytes(path: Path) -> int:
    """The bytes of the files under `path` (0 if it is gone)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


@contextmanager
def disk_full_is_user_error(
    path: str | os.PathLike[str], what: str, keep: str = "", like: Path | None = None
) -> Iterator[None]:
    """Within the block, turn a full disk (ENOSPC, EDQUOT) into one DiskFullError naming the path.

    Args:
        path: where the block writes.
        what: what it writes (for the message).
        keep: what is kept, e.g. the last good checkpoint.
        like: an earlier output of the same kind; its size says how much space is needed.
    """
    try:
        yield
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        full = disk_full_in(e)
        if full is None:
            raise
        kept = f"; {keep}" if keep else ""
        needed = f"about {tree_bytes(like) / 2**20:.1f} MiB (as {like} took)" if like is not None else "space"
        raise DiskFullError(
            f"no space left on the device of {path} while writing {what} ({full.strerror or 'disk full'}){kept}. "
            f"Free {needed} there, or write elsewhere, then continue"
        ) from None
