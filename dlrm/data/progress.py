"""Progress of long work (convert, inspect, export) on stderr: done/total, rows/s (or another unit's)
and an ETA, a line at most every few seconds, none for work shorter than that; and `Step`, one line
when a step of such work starts and one with its time and rate when it ends."""

from __future__ import annotations

import sys
import time


class Progress:
    """`update(done, rows)` after each piece of work: `done` of `total` units (bytes read, row groups),
    `rows` rows (or `unit`s: tensors) so far. Prints "WHAT: 12% (1,234,567 rows, 250,000 rows/s, ETA
    40s)" every `every` seconds."""

    def __init__(self, what: str, total: float, every: float = 5.0, unit: str = "rows"):
        self.what, self.total, self.every, self.unit = what, max(float(total), 1.0), every, unit
        self.start = self.last = time.monotonic()

    def update(self, done: float, rows: int) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        share = min(1.0, done / self.total)
        eta = elapsed * (1 - share) / share if share > 0 else float("nan")
        print(
            f"{self.what}: {share:.0%} ({rows:,} {self.unit}, {rows / elapsed:,.0f} {self.unit}/s, ETA {eta:.0f}s)",
            file=sys.stderr,
            flush=True,
        )


class Step:
    """A step of long work, as a context manager: prints "WHAT: DOING" on entry and "WHAT: DOING: done
    in 12.3s (45 MiB/s)" on a clean exit, for a step of `mib` MiB (the rate's) at least `LONG_MIB`,
    or of unknown size (`mib` None); nothing for a smaller one, as `Progress` prints nothing for
    short work."""

    LONG_MIB = 256.0  # about a second of reading or hashing, or more

    def __init__(self, what: str, doing: str, mib: float | None = None):
        self.what, self.doing, self.mib = what, doing, mib
        self.shown = mib is None or mib >= self.LONG_MIB

    def __enter__(self) -> Step:
        if self.shown:
            print(f"{self.what}: {self.doing}", file=sys.stderr, flush=True)
        self.start = time.monotonic()
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None or not self.shown:
            return
        seconds = time.monotonic() - self.start
        rate = f" ({self.mib / seconds:,.0f} MiB/s)" if self.mib is not None and seconds > 0 else ""
        print(f"{self.what}: {self.doing}: done in {seconds:.1f}s{rate}", file=sys.stderr, flush=True)
