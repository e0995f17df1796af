"""When the training loop's components act (log, evaluate, checkpoint, profile): every n steps and/or
at the last step. Each component holds its `Every` and asks it with the step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Every:
    """Due at steps n, 2n, ... (n = 0: never) and, if `at_end`, at the last step."""

    n: int
    at_end: bool = True

    def due(self, step: int, last: bool) -> bool:
        return (self.n > 0 and step % self.n == 0) or (last and self.at_end)
