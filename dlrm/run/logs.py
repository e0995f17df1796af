"""Logging for one process of a job: set up once, at the entry point, with `setup_logging`.

Rank 0 logs INFO and above to the console and everything it shows, time-stamped, to the run's
`train.log` (DEBUG too with debug=True). Other ranks log warnings and errors only, to stderr, prefixed
with their rank. Library noise is handled at its source (the root logger stays at WARNING, a few named
library loggers and known notices are quieted), never by muting the `dlrm` loggers.

`enable_fault_handler`: a crash in native code prints every thread's Python stack. `done_line`: the
run's closing console line.
"""

# Each library's noise and why it is quieted so: docs/design/logging.md.
from __future__ import annotations

import faulthandler
import logging
import sys
import time
import warnings
from pathlib import Path

from tqdm import tqdm

LOG_FILE = "train.log"
JOB_START = time.monotonic()  # imported by the entry point before the heavy imports: the job's clock

# Loggers of libraries whose warnings do not concern the run (docs/design/logging.md).
QUIET_LOGGERS = {
    "torchrec.distributed.planner.storage_reservations": logging.ERROR,
    "torch.fx._symbolic_trace": logging.ERROR,
}


# (logger name, message start) of library warnings that describe our design, not a problem (see above).
KNOWN_NOTICES = (
    ("root", "Sharding spec not found for "),
    ("torchrec.distributed.utils", "Sharding Type is data_parallel, caching params will be ignored"),
    ("torchrec.distributed.utils", "Compute Kernel is dense, caching params will be ignored"),
)
DENSE_LOOKUP_WARNING = r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered"


def _not_a_known_notice(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(record.name == name and message.startswith(start) for name, start in KNOWN_NOTICES)


class _ConsoleHandler(logging.StreamHandler):
    """Writes through tqdm, so a progress bar on the terminal is not broken up by log lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never raise into the program
            self.handleError(record)


class _ConsoleFormatter(logging.Formatter):
    """Plain messages; warnings and errors name their level and logger."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            text = (
                f"{record.levelname.lower()}: {text}"
                if record.name.startswith("dlrm")
                else (f"{record.levelname.lower()} ({record.name}): {text}")
            )
        return text


def setup_logging(rank: int, run_dir: Path | None, debug: bool = False) -> None:
    """Configure this process's logging (idempotent: handlers set by earlier calls are replaced).

    Args:
        rank: the process's global rank.
        run_dir: where rank 0 writes train.log (None: no file).
        debug: also log DEBUG records of the `dlrm` loggers (to the console and train.log).
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.WARNING)
    ours = logging.getLogger("dlrm")
    if rank == 0:
        ours.setLevel(logging.DEBUG if debug else logging.INFO)
        console = _ConsoleHandler(sys.stdout)
        console.setFormatter(_ConsoleFormatter("%(message)s"))
        console.addFilter(lambda record: getattr(record, "console", True))  # extra={"console": False}: file only
        root.addHandler(console)
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            file = logging.FileHandler(Path(run_dir) / LOG_FILE)
            file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            root.addHandler(file)
    else:
        ours.setLevel(logging.WARNING)
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter(f"[rank {rank}] %(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
    for handler in root.handlers:
        handler.addFilter(_not_a_known_notice)
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    for module in ("torch", "torchrec", "fbgemm_gpu"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=rf"{module}(\.|$)")
    warnings.filterwarnings("ignore", message=DENSE_LOOKUP_WARNING, category=UserWarning)
    logging.captureWarnings(True)


def enable_fault_handler() -> None:
    """A rank that crashes in native code prints every thread's Python stack instead of dying silently."""
    try:
        if sys.__stderr__ is not None and not faulthandler.is_enabled():
            faulthandler.enable(file=sys.__stderr__)
    except (ValueError, OSError):  # a stderr without a file descriptor (an embedding host)
        pass


def done_line(summary: dict, run_dir: Path) -> str:
    """The closing line: steps, train samples/s, eval AUC and log loss, where the outputs are."""
    speed, auc, logloss = summary["train_samples_per_s"], summary["eval_auc"], summary["eval_logloss"]
    return (
        f"done: {summary['steps']} steps, {f'{speed:.0f}' if speed else 'no'} train samples/s, "
        f"eval auc {auc and round(auc, 4)}, logloss {logloss and round(logloss, 4)}; outputs in {run_dir}"
    )
