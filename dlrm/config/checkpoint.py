"""The checkpoint section: where a run's checkpoints go, how often, how many are kept."""

from __future__ import annotations

from dataclasses import dataclass

from dlrm.config.checks import _require_count, _require_positive


@dataclass
class CheckpointConfig:
    """Distributed checkpoints: where they go, when they are saved, how many are kept, how they load."""

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
    async_save: bool = True
    """Write periodic saves in the background (torch.distributed.checkpoint.async_save): training
    stops only to copy the state to host memory (one more copy of the rank's state while it is
    written); the digests and the manifest follow when the files are written, and the next save, a
    clean stop and the run's end wait for it. The save at the end is synchronous either way."""
    on_signal: bool = False
    """On SIGINT/SIGTERM (Ctrl-C, preemption) save a checkpoint at the step where the run stops (the
    next log step, dlrm.trainer.stop) before exiting; false: stop without saving."""

    def check(self, key: str = "checkpoint") -> None:
        _require_count(f"{key}.every_steps", self.every_steps, "no periodic saves")
        _require_positive(f"{key}.keep", self.keep)
