"""Progress on the console: a bar on a terminal, plain lines otherwise, with elapsed time and an ETA."""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

log = logging.getLogger(__name__)
FILE_ONLY = {"console": False}  # `extra` for a record that goes to train.log but not the console


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss, e.g. 75 -> '1:15'."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """A progress bar on an interactive terminal, plain log lines otherwise; silent off rank 0.

    mode: auto (bar if stderr is a terminal), bar, lines, none. Lines go to the `dlrm` logger
    (console and train.log), with elapsed time and an ETA from the mean step time so far.
    """

    def __init__(self, total: int, mode: str, enabled: bool, first_step: int = 0) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if enabled else "none"
        self.total = total
        self.first_step = first_step
        self.start = time.monotonic()
        self._bar = (
            tqdm(total=total, initial=first_step, unit="step", dynamic_ncols=True) if self.mode == "bar" else None
        )

    def update(self, step: int, steps_done: int, loss: float, lr: float, samples_per_s: float) -> None:
        """Report the figures of the window that ended at `step` after `steps_done` new steps."""
        elapsed = time.monotonic() - self.start
        eta = elapsed / max(1, step - self.first_step) * (self.total - step)
        text = f"loss {loss:.4f} lr {lr:.4g} {samples_per_s:,.0f} samples/s"
        if self._bar is not None:
            self._bar.update(steps_done)
            self._bar.set_postfix_str(text)
            log.info(f"step {step}/{self.total} {text}", extra=FILE_ONLY)  # the bar shows it on the console
        elif self.mode == "lines":
            log.info(f"step {step}/{self.total} {text} | {clock(elapsed)} elapsed, eta {clock(eta)}")
        else:
            log.debug(f"step {step}/{self.total} {text}")

    def message(self, text: str) -> None:
        """A line for the console and train.log (logged on rank 0 whatever the mode)."""
        log.info(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
