"""The checkpoint and run sections: where a run's checkpoints go, and the run's name."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlrm.config.errors import _fail, _require_count, _require_positive


@dataclass
class CheckpointConfig:
    """Distributed checkpoints (dlrm.checkpoint)."""

    dir: str | None = None
    """Where checkpoints go (None: <run dir>/checkpoints)."""
    every_steps: int = 0
    """Save every this many steps; 0 = no periodic saves."""
    at_end: bool = True
    """Save when training ends."""
    keep: int = 2
    """Complete checkpoints kept (older ones that this invocation wrote are deleted: never an earlier
    invocation's)."""
    verify: bool = True
    """Check every file's sha256 against the manifest before loading (false: sizes only)."""
    on_signal: bool = False
    """On SIGINT/SIGTERM (Ctrl-C, preemption) save a checkpoint at the step where the run stops (the
    next log step, dlrm.trainer.stop) before exiting; false: stop without saving."""

    def check(self, key: str = "checkpoint") -> None:
        _require_count(f"{key}.every_steps", self.every_steps, "no periodic saves")
        _require_positive(f"{key}.keep", self.keep)


@dataclass
class RunConfig:
    """The run a job belongs to (dlrm.trainer.run_dir)."""

    name: str | None = None
    """A named run lives in outputs/NAME (unless hydra.run.dir is given), so a later invocation with
    the same name and trainer.resume=auto continues it. None: a new timestamped run directory.
    1 to 255 letters, digits, '.', '_' and '-', not starting with '.' or '-' (portable directory names)."""

    def check(self, key: str = "run") -> None:
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}", self.name):
            shown = self.name if len(self.name) <= 60 else f"{self.name[:40]}... ({len(self.name)} characters)"
            _fail(
                f"{key}.name",
                shown,
                "use 1 to 255 letters, digits, '.', '_' and '-', not starting with '.' or '-' (it names a directory)",
            )
