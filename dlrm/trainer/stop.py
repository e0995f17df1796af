"""Clean stops: SIGINT (Ctrl-C) and SIGTERM (a cluster's preemption; torchrun forwards the signal it
gets to every rank) end the training at the next log step, on every rank together.

`StopRequest` records the first signal this process gets; the trainer adds the flag to the loss it
already all-reduces at each log step, so every rank learns at the same step that some rank was
signalled, saves a checkpoint there if `checkpoint.on_signal`, and raises `TrainingStopped`: one
line (rank 0) naming the step, the last checkpoint and how to continue; exit status 128 + signal,
as a shell reports a process killed by it. A second signal before that step stops at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from dlrm.errors import UserError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingStopped(UserError):
    """The run stopped on a signal; the message says where and how to continue."""

    same_on_all_ranks = True  # every rank stops at the same step: rank 0 says it
    quiet_elsewhere = True  # the other ranks exit at once, without a line (dlrm.errors)
    prefix = "stopped"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequest:
    """The first SIGINT/SIGTERM this process got (`signum`, None: none), while installed."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.stopping = False  # the stop is decided: further signals change nothing
        self._previous: dict[int, object] = {}
        self._step = lambda: 0

    def install(self, step=lambda: 0) -> StopRequest:
        """Handle the signals (main thread only; elsewhere signals keep their handlers). `step()`:
        the current step, for the message of a second signal."""
        self._step = step
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            return
        if self.signum is not None:  # a second signal: the user does not want to wait
            self.stopping = True
            name = signal.Signals(signum).name
            raise TrainingStopped(
                f"by a second {name} during step {self._step() + 1}, without a checkpoint; "
                "continue from the last one with trainer.resume=auto",
                signum,
            )
        self.signum = signum

    @property
    def flag(self) -> float:
        """1.0 once a signal came, else 0.0: summed over ranks at each log step."""
        return 0.0 if self.signum is None else 1.0
