"""The clock of the training loop's throughput.

`ThroughputWindow` collects the losses of the steps since the last log and their wall time,
paused while the loop evaluates or saves, so samples/s counts training alone. `RunTime` adds up a
run's time across its invocations (a continuation carries the time recorded in its checkpoint).
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
    the next window. `train_seconds` sums the closed windows.

    Args:
        clock: seconds, monotonic.
        sync: waits for the device's queued work; called only when the clock stops (a pause, a close),
            so that the window's time holds its steps' device work.
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
        self._paused = False

    def add(self, loss: T | None) -> None:
        self.steps += 1
        if loss is not None:
            self.losses.append(loss)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._sync()
        self._elapsed += self._clock() - self._since
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            self._since = self._clock()

    def seconds(self) -> float:
        """Wall time of the open window so far, pauses excluded (also while paused)."""
        return self._elapsed + (0.0 if self._paused else self._clock() - self._since)

    def close(self) -> tuple[list[T], int, float]:
        """(losses, steps, seconds) of this window; the next one opens now."""
        self._sync()
        result = (self.losses, self.steps, self.seconds())
        self.train_seconds += result[2]
        self._open()
        return result


class RunTime:
    """A run's training and wall seconds over all its invocations, as of a step.

    A checkpoint records `record(step)`; the invocation that resumes from it `carry`s that record,
    so its own `record` (and the summary) covers the whole run: the invocations' time up to the
    checkpoint each continued from, and this one's. Steps trained after the last checkpoint by an
    invocation that then stopped are trained again, and only their second time counts.
    `timed_steps` says how many steps the seconds cover (fewer than `step` after a checkpoint
    written before runs recorded their time).
    """

    def __init__(self, window: ThroughputWindow, clock: Callable[[], float] = time.perf_counter) -> None:
        self.window, self._clock = window, clock
        self._carried = {"train_seconds": 0.0, "wall_seconds": 0.0, "timed_steps": 0, "invocations": 0}
        self.first_step = 0
        self._started = clock()

    def open(self, step: int, window: ThroughputWindow) -> None:
        """This invocation starts timing at `step` with `window` (the loop's throughput clock)."""
        self.window, self.first_step, self._started = window, step, self._clock()

    def carry(self, record: object, step: int) -> None:
        """Continue from a checkpoint at `step` that recorded `record` (None or malformed: not timed)."""
        keys = ("train_seconds", "wall_seconds", "timed_steps", "invocations")
        valid = isinstance(record, dict) and all(
            isinstance(record.get(k), (int, float)) and not isinstance(record.get(k), bool) and 0 <= record[k] < 1e15
            for k in keys
        )
        if valid and isinstance(record, dict) and record["timed_steps"] <= step:
            self._carried = {k: record[k] for k in keys}
        else:
            self._carried = {"train_seconds": 0.0, "wall_seconds": 0.0, "timed_steps": 0, "invocations": 1}

    def record(self, step: int) -> dict:
        """{train_seconds, wall_seconds, timed_steps, invocations} of the run up to `step` (now): the
        closed windows' training time, and the open window's if it holds steps."""
        c = self._carried
        return {
            "train_seconds": c["train_seconds"]
            + self.window.train_seconds
            + self.window.seconds() * bool(self.window.steps),
            "wall_seconds": c["wall_seconds"] + self._clock() - self._started,
            "timed_steps": int(c["timed_steps"]) + step - self.first_step,
            "invocations": int(c["invocations"]) + 1,
        }
