"""The run section: the run's name (its directory)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlrm.config.checks import _fail


@dataclass
class RunConfig:
    """The run a job belongs to: its name, hence its directory."""

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
