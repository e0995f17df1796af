"""The clock of the training loop's throughput (when components act: `dlrm.cadence`).

`ThroughputWindow` collects the losses of the steps since the last log and their wall time,
paused while the loop evaluates or saves, so samples/s counts training alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class ThroughputWindow(Generic[T]):
    """The steps since the window opened: their losses, and their wall time without the pauses.

    `add` records a step (loss None: a skipped step, counted but without a loss); `paused()` stops
    the clock while the loop does other work; `close()` returns (losses, steps, seconds) and opens
    the next window. `train_seconds` sums the closed windows. `sync` waits for the device's queued
    work (dlrm.distributed.topology.synchronizer): called when the clock stops (a pause, a close) so that
    the window's time holds its steps' device work, and nowhere else.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = lambda: None) -> None:
        self._clock, self._sync = clock, sync
        self.train_seconds = 0.0
        self._open()

    def _open(self) -> None:
        self.losses: list[T] = []
        self.steps = 0
        self._elapsed = 0.0
        self._since = self._clock()

    def add(self, loss: T | None) -> None:
        self.steps += 1
        if loss is not None:
            self.losses.append(loss)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._sync()
        self._elapsed += self._clock() - self._since
        try:
            yield
        finally:
            self._since = self._clock()

    def seconds(self) -> float:
        """Wall time of the open window so far, pauses excluded."""
        return self._elapsed + self._clock() - self._since

    def close(self) -> tuple[list[T], int, float]:
        """(losses, steps, seconds) of this window; the next one opens now."""
        self._sync()
        result = (self.losses, self.steps, self.seconds())
        self.train_seconds += result[2]
        self._open()
        return result
