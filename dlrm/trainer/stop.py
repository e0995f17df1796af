"""Clean stops: SIGINT (Ctrl-C), SIGTERM (a cluster's preemption; torchrun forwards the signal it
gets to every rank) and SIGHUP (a closed terminal, a dropped ssh session) end the training at the
next log step, on every rank together.

`StopRequest`'s handler only records the first signal this process gets; it never raises (a signal
lands anywhere, e.g. inside DCP's collectives, where an exception would be gathered and pickled).
The trainer adds the flag to the loss it already all-reduces at each log step, so every rank learns
at the same step that some rank was signalled, saves a checkpoint there if `checkpoint.on_signal`,
and raises `TrainingStopped`: one line (rank 0) naming the step, the last checkpoint and how to
continue; exit status 128 + signal, as a shell reports a process killed by it. A second signal
before that step ends the process at once: rank 0 prints one `stopped:` line, and every rank exits
with 128 + signal (os._exit: no clean-up, no checkpoint). Once the stop is under way (its checkpoint
being saved), further signals change nothing. A rank that got one signal and then lost a peer that
had got two reports the stop, not the lost connection (`stopped_meanwhile`, `explained_failure`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Protocol

from dlrm.common.errors import UserError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class TrainingStopped(UserError):
    """The run stopped on a signal; the message says where and how to continue."""

    same_on_all_ranks = True  # every rank stops at the same step: rank 0 says it
    quiet_elsewhere = True  # the other ranks exit at once, without a line (dlrm.common.errors)
    prefix = "stopped"

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum

    @classmethod
    def at_log_step(
        cls, signum: int, step: int, total_steps: int, checkpoint: Path | None, on_signal: bool, where: str
    ) -> TrainingStopped:
        """The stop of every rank at log step `step` of `total_steps`; `checkpoint`: the last one (None:
        none), `on_signal`: checkpoint.on_signal, `where`: the overrides that find the run again."""
        hint = "" if checkpoint or on_signal else " (checkpoint.on_signal=true saves one at a stop)"
        return cls(
            f"by {signal.Signals(signum).name} at step {step} of {total_steps}; last checkpoint: "
            f"{checkpoint or 'none'}{hint}; continue with the same command and{where} trainer.resume=auto",
            signum,
        )

    def __reduce__(self):  # pickled (e.g. gathered by a collective) and rebuilt with both arguments
        return type(self), (str(self), self.signum)


class Progress(Protocol):
    """What a stop reads the current step from (the train state)."""

    step: int


class StopRequest:
    """The first SIGINT/SIGTERM/SIGHUP this process got (`signum`, None: none), while installed.

    Args:
        is_main: whether this is rank 0, which prints the line of a second signal's immediate exit.
        exit: how a second signal ends the process (default os._exit).
    """

    def __init__(self, is_main: bool = True, exit=os._exit) -> None:
        self.signum: int | None = None
        self.stopping = False  # the stop is decided: further signals change nothing
        self.is_main = is_main
        self._exit = exit
        self._previous: dict[int, object] = {}
        self._progress: Progress | None = None

    def install(self, progress: Progress | None = None) -> StopRequest:
        """Handle the signals (main thread only; elsewhere signals keep their handlers). `progress.step`:
        the current step, for the line of a second signal (None: step 0)."""
        global _installed
        self._progress = progress
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
            _installed = self
        return self

    def uninstall(self) -> None:
        """Restore the previous handlers, unless a signal came: the process is then stopping, and a
        further signal must still end it as documented (not kill it without a word)."""
        global _installed
        if self.signum is not None:
            return
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]
        self._previous = {}
        _installed = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        """Record the first signal; a second one ends the process at once (see the module). Never raises."""
        if self.stopping:
            return
        if self.signum is None:
            self.signum = signum
            return
        self.stopping = True  # a second signal: the user does not want to wait
        if self.is_main:
            line = (
                f"stopped: by a second {signal.Signals(signum).name} during step {self.step + 1}, without a "
                "checkpoint; continue from the last one with the same command and trainer.resume=auto\n"
            )
            os.write(2, line.encode())  # not print: the main thread may be inside a write to stderr
        self._exit(128 + signum)

    @property
    def step(self) -> int:
        """The current step of the installed progress (0 without one)."""
        return self._progress.step if self._progress is not None else 0

    @property
    def flag(self) -> float:
        """1.0 once a signal came, else 0.0: summed over ranks at each log step."""
        return 0.0 if self.signum is None else 1.0


_installed: StopRequest | None = None  # the handler in place (main thread), for `stopped_meanwhile`


def stopped_meanwhile() -> TrainingStopped | None:
    """If this process got a stop signal before the failure being reported (a peer that got two signals
    is gone: its connection dropped): the stop to report instead, and further signals change nothing."""
    stop = _installed
    if stop is None or stop.signum is None:
        return None
    stop.stopping = True
    return TrainingStopped(
        f"by {signal.Signals(stop.signum).name} during step {stop.step + 1}, without a checkpoint (a second "
        "signal ended another rank at once); continue from the last one with the same command and "
        "trainer.resume=auto",
        stop.signum,
    )


def explained_failure(e: BaseException, collective_timeout_s: float | None) -> BaseException:
    """`e`, or the user error behind it: a peer lost to a signal or a collective timeout, explained.

    Args:
        e: what ended the run.
        collective_timeout_s: the run's collective timeout; None: the config was never read (no peers yet).
    """
    if collective_timeout_s is None or "torch.distributed" not in sys.modules:
        return e
    from torch.distributed.checkpoint import CheckpointException

    from dlrm.distributed.topology import collective_failure

    failure = collective_failure(e, collective_timeout_s)
    if failure is not None or isinstance(e, CheckpointException):  # a peer gone, maybe by a signal
        failure = stopped_meanwhile() or failure
    return failure or e
