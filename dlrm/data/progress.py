"""Progress of long data work (convert, inspect) on stderr: done/total, rows/s and an ETA, a line at
most every few seconds, none for work shorter than that."""

from __future__ import annotations

import sys
import time


class Progress:
    """`update(done, rows)` after each piece of work: `done` of `total` units (bytes read, row groups),
    `rows` rows so far. Prints "WHAT: 12% (1,234,567 rows, 250,000 rows/s, ETA 40s)" every `every`
    seconds."""

    def __init__(self, what: str, total: float, every: float = 5.0):
        self.what, self.total, self.every = what, max(float(total), 1.0), every
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
            f"{self.what}: {share:.0%} ({rows:,} rows, {rows / elapsed:,.0f} rows/s, ETA {eta:.0f}s)",
            file=sys.stderr,
            flush=True,
        )
