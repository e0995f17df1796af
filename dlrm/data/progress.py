"""Progress of long work on stderr: `Progress` (share done, rate and ETA every few seconds) and `Step`
(a line when a step starts and one with its time and rate when it ends)."""

from __future__ import annotations

import sys
import time


class Progress:
    """Progress lines for work of `total` units (bytes read, row groups), none for short work.

    Call `update(done, rows)` after each piece of work: `done` of `total` units and `rows` rows (or
    `unit`s) so far. At most every `every` seconds it prints "WHAT: P% (R rows, S rows/s, ETA Ts)".
    """

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
    """A step of long work, as a context manager.

    Prints "WHAT: DOING" on entry and "WHAT: DOING: done in Ts (R MiB/s)" on a clean exit, for a step
    of `mib` MiB at least `LONG_MIB` or of unknown size (`mib` None); nothing for a smaller step.
    """

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
