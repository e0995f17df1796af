"""Time-ordered Parquet datasets (data.parquet.periods) and the recorded data position: periods read in
time order, shuffled only within a period; a continuation over added partitions reads exactly the rows
not read yet; a resume over the same files equals the uninterrupted stream; a changed or vanished file
is refused naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from dlrm.config import ConfigError, ParquetConfig, SparseColumnConfig
from dlrm.config.choices import SparseKind
from dlrm.config.periods import PeriodsConfig
from dlrm.data.parquet.files import ParquetDataError
from dlrm.data.parquet.source import ParquetSource
from tests.helpers.parquet_data import ROWS, TABLES, table, write_dataset
from tests.helpers.periods_data import DAYS, GROUP, PER_DAY, write_days

NAMES, ROWS_OF = list(TABLES), list(TABLES.values())
B = 64


def make(path, train=(8, 9), evaluate=(11, 11), shuffle=True, key="day") -> ParquetSource:
    sparse = [
        SparseColumnConfig(name="user", kind=SparseKind.id),
        SparseColumnConfig(name="items", kind=SparseKind.ids),
        SparseColumnConfig(name="city", kind=SparseKind.string),
    ]
    periods = PeriodsConfig(key=key, train=[str(d) for d in train], eval=[str(d) for d in evaluate])
    cfg = ParquetConfig(path=str(path), dense=["pos", "x"], sparse=sparse, shuffle=shuffle, periods=periods)
    cfg.check("data.parquet")
    return ParquetSource(cfg, NAMES, ROWS_OF, B, seed=3)


def rows_of(batch) -> list[int]:
    return np.rint(batch.dense_features[:, 0].double().numpy() * ROWS).astype(np.int64).tolist()


def read(src: ParquetSource, start: int, steps: int) -> list:
    it = src.batches("train", 0, 1, start)
    out = [next(it) for _ in range(steps)]
    it.close()  # no read-ahead left running over files a test rewrites
    return out


def day_of(row: int) -> int:
    return DAYS[0] + row // PER_DAY


@pytest.fixture()
def days(tmp_path) -> Path:
    write_days(tmp_path)
    return tmp_path


def test_a_window_is_read_in_time_order_shuffled_within_each_period(days):
    src = make(days, train=(8, 10))
    n = src.num_batches("train")
    assert n == 3 * PER_DAY // B
    rows = [r for batch in read(src, 0, n) for r in rows_of(batch)]
    assert sorted(rows) == list(range(3 * PER_DAY))  # one pass: every row of the window once
    assert [day_of(r) for r in rows] == sorted(day_of(r) for r in rows)  # day 10 after day 9 (numeric)
    assert rows != sorted(rows)  # shuffled, within a day
    assert src.eval_periods == ["11"] and src.period_batch_count("11") == PER_DAY // B
    evaluated = [r for batch in src.period_batches("11", 0, 1) for r in rows_of(batch)]
    assert evaluated == list(range(3 * PER_DAY, 4 * PER_DAY))


def test_a_period_column_partitions_as_directories_do(tmp_path):
    write_days(tmp_path, column=True)
    src = make(tmp_path, train=(9, 10), shuffle=False)
    rows = [r for batch in read(src, 0, src.num_batches("train")) for r in rows_of(batch)]
    assert rows == list(range(PER_DAY, 3 * PER_DAY))


def test_a_continuation_over_added_partitions_reads_exactly_the_rows_not_read(days):
    first = make(days, train=(8, 9))
    steps = 5  # of 6 in a pass over days 8-9: 64 rows of them unread
    read_rows = [r for batch in read(first, 0, steps) for r in rows_of(batch)]
    record = first.position(steps)
    assert sum(sum(f["read"].values()) for f in record["files"]) == steps * B
    later = make(days, train=(8, 10))
    line = later.resume_position(record, steps, "ckpt")
    assert line is not None and "1 new file" in line
    remaining = (3 * PER_DAY - steps * B) // B
    assert later.steps_for_passes(1) == steps + remaining
    more = [r for batch in read(later, steps, remaining) for r in rows_of(batch)]
    assert len(set(more)) == len(more) and not set(more) & set(read_rows)
    assert set(more) | set(read_rows) == set(range(3 * PER_DAY))
    # the pass after reads the whole window again
    again = [r for batch in read(later, steps + remaining, 3 * PER_DAY // B) for r in rows_of(batch)]
    assert sorted(again) == list(range(3 * PER_DAY))


def test_a_resume_over_the_same_files_continues_the_same_stream(days):
    whole = make(days, train=(8, 9))
    expected = read(whole, 0, 14)  # across two pass boundaries
    first = make(days, train=(8, 9))
    read(first, 0, 4)
    resumed = make(days, train=(8, 9))
    assert resumed.resume_position(first.position(4), 4, "ckpt") is None
    for a, b in zip(expected[4:], read(resumed, 4, 10), strict=True):
        assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
    # a continuation, then a resume of it over the same files: the continuation's stream exactly
    later = make(days, train=(8, 10))
    later.resume_position(first.position(4), 4, "ckpt")
    expected = read(later, 4, 8)
    again = make(days, train=(8, 10))
    again.resume_position(later.position(7), 7, "ckpt")
    for a, b in zip(expected[3:], read(again, 7, 5), strict=True):
        assert torch.equal(a.dense_features, b.dense_features)


def test_a_changed_or_vanished_file_is_refused_naming_it(days):
    src = make(days, train=(8, 9))
    read(src, 0, 3)
    record = src.position(3)
    day9 = days / "day=9" / "part-0.parquet"
    pq.write_table(table(PER_DAY, seed=1, first=PER_DAY), day9, row_group_size=GROUP)  # same size class, new rows
    with pytest.raises(ParquetDataError, match=r"day=9/part-0.parquet changed since it was read") as e:
        make(days, train=(8, 10)).resume_position(record, 3, "ckpt")
    assert "\n" not in str(e.value)
    shutil.rmtree(days / "day=9")
    with pytest.raises(ParquetDataError, match=r"day=9/part-0.parquet was read by this run .* is gone"):
        make(days, train=(8, 10)).resume_position(record, 3, "ckpt")


def test_a_window_may_slide_past_periods_read_before(days):
    src = make(days, train=(8, 9))
    read(src, 0, 6)
    record = src.position(6)
    shutil.rmtree(days / "day=8")  # outside the new window: gone is fine
    later = make(days, train=(9, 10))
    later.resume_position(record, 6, "ckpt")
    rows = [r for batch in read(later, 6, later.steps_for_passes(1) - 6) for r in rows_of(batch)]
    assert sorted(rows) == list(range(2 * PER_DAY, 3 * PER_DAY))  # day 9 was read whole: day 10 only


def test_period_settings_are_checked(days):
    with pytest.raises(ConfigError, match=r"periods.eval.*overlaps the training window"):
        make(days, train=(8, 10), evaluate=(10, 11))
    with pytest.raises(ConfigError, match=r"periods.train.*first <= last"):
        make(days, train=(10, 8))
    found = r"periods.train = \['20', '21'\] selects no rows.*\['8', '9', '10', '11'\]"
    with pytest.raises(ParquetDataError, match=found):
        make(days, train=(20, 21))
    with pytest.raises(ParquetDataError, match=r"no hour=... directory and has no column 'hour'"):
        make(days, key="hour")


@pytest.mark.parametrize("change", ["renamed", "shortened", "rewritten"])
def test_a_resumed_unpartitioned_run_refuses_files_changed_under_it(tmp_path, change):
    write_dataset(tmp_path)  # part-0, part-1: no periods
    sparse = [
        SparseColumnConfig(name="user", kind=SparseKind.id),
        SparseColumnConfig(name="items", kind=SparseKind.ids),
        SparseColumnConfig(name="city", kind=SparseKind.string),
    ]
    cfg = ParquetConfig(path=str(tmp_path), dense=["pos", "x"], sparse=sparse)
    src = ParquetSource(cfg, NAMES, ROWS_OF, B, seed=0)
    read(src, 0, 3)
    record = src.position(3)
    part = tmp_path / "part-1.parquet"
    if change == "renamed":
        part.rename(tmp_path / "part-9.parquet")
    else:
        rows = ROWS // 2 - (GROUP if change == "shortened" else 0)
        pq.write_table(table(rows, seed=5, first=ROWS // 2), part, row_group_size=40)
    how = "is gone" if change == "renamed" else "changed since it was read"
    with pytest.raises(ParquetDataError, match=f"part-1.parquet (was read by this run .*{how}|{how})"):
        ParquetSource(cfg, NAMES, ROWS_OF, B, seed=0).resume_position(record, 3, "ckpt")
