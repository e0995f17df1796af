"""The deltas section: publishing the rows changed since the last publication."""

from __future__ import annotations

from dataclasses import dataclass

from dlrm.config.checks import _require_count


@dataclass
class DeltasConfig:
    """Deltas for serving: the rows of each table that the steps since the last publication looked up,
    and the dense weights, at a checkpoint-like cadence."""

    dir: str | None = None
    """Where deltas go (None: <run dir>/deltas)."""
    every_steps: int = 0
    """Publish every this many steps; 0 = no deltas (and no tracking of changed rows)."""
    at_end: bool = True
    """With every_steps > 0: publish when training ends too."""

    def check(self, key: str = "deltas") -> None:
        _require_count(f"{key}.every_steps", self.every_steps, "no deltas")
