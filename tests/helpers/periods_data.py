"""A small dataset partitioned by day: days 8..11 of PER_DAY rows, day d's rows numbered from
(d - 8) * PER_DAY (the pos feature of tests/helpers/parquet_data.py names them)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.helpers.parquet_data import table

PER_DAY, GROUP = 192, 48
DAYS = (8, 9, 10, 11)


def write_days(root: Path, days=DAYS, column: bool = False) -> None:
    """PER_DAY rows per day in day=D/part-0.parquet, or (column) in flat files with a `day` column."""
    for d in days:
        t = table(PER_DAY, first=(d - DAYS[0]) * PER_DAY)
        if column:
            t = t.append_column("day", pa.array([d] * PER_DAY, pa.int64()))
            path = root / f"day-{d:02d}.parquet"
        else:
            (root / f"day={d}").mkdir(parents=True, exist_ok=True)
            path = root / f"day={d}" / "part-0.parquet"
        pq.write_table(t, path, row_group_size=GROUP)
