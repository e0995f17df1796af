"""The time periods of a Parquet dataset (`data.parquet.periods`): which key names a row's period, the
training window and the evaluated periods."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm.config.checks import _fail


def period_sort_key(value: str) -> tuple:
    """How periods order: numerically where the value is an integer (day=10 after day=9), else as text
    (ISO dates such as 2024-01-31 order so)."""
    text = str(value)
    try:
        return (0, int(text), "")
    except ValueError:
        return (1, 0, text)


def in_range(value: str, bounds: list[str]) -> bool:
    """Whether period `value` lies in [first, last] (`bounds`, both ends included)."""
    first, last = bounds
    return period_sort_key(first) <= period_sort_key(value) <= period_sort_key(last)


@dataclass
class PeriodsConfig:
    """A dataset partitioned by time: rows read period by period in time order."""

    key: str | None = None
    """The partition key: Hive-style directories `key=value/` (e.g. `day` for `day=3/`), or else a
    column of that name whose row groups each hold one value; None: the dataset is not partitioned."""
    train: list[str] = field(default_factory=list)
    """The training window [first, last] (periods, both included); [] = every period not in `eval`.
    Epochs and shuffling stay inside the window; a continuation may widen it (new rows only are read)."""
    eval: list[str] = field(default_factory=list)
    """The evaluated periods [first, last]; each is scored on its own (metrics per period) and all
    together; [] = no evaluation split."""

    def check(self, key: str) -> None:
        for name in ("train", "eval"):
            bounds = getattr(self, name)
            if bounds and (len(bounds) != 2 or not in_range(bounds[1], [bounds[0], bounds[1]])):
                _fail(f"{key}.{name}", list(bounds), "give [first, last] periods, first <= last, e.g. [1,6]")
            if bounds and not self.key:
                _fail(f"{key}.key", self.key, f"{key}.{name} needs the partition key, e.g. {key}.key=day")
        if self.train and self.eval:
            overlap = in_range(self.eval[0], self.train) or in_range(self.train[0], self.eval)
            if overlap:
                _fail(
                    f"{key}.eval",
                    list(self.eval),
                    f"it overlaps the training window {list(self.train)}: evaluate on periods not trained on",
                )
