"""data.parquet.reader_workers: N threads give the batches of one, in the same order, resume exactly,
raise an error where one worker would, and stop cleanly; string hashes made once per row group
equal those made per batch."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm.config import ConfigError, validate
from dlrm.config.choices import SparseKind
from dlrm.config.compose import compose
from dlrm.data.parquet.files import ParquetValueError
from dlrm.data.parquet.reader import RowGroupReader
from dlrm.data.prefetch import OrderedWorkers
from tests.helpers.parquet_data import overrides, table, write_dataset
from tests.helpers.parquet_source import B, assert_batches_equal, config, rows_of, source


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("parquet_workers")
    write_dataset(d)
    return d


def take(src, split: str, rank: int, world: int, steps: int | None, start: int = 0) -> list:
    it = src.batches(split, rank, world, start)
    out = list(it) if steps is None else [next(it) for _ in range(steps)]
    it.close()
    return out


@pytest.mark.parametrize("workers", [2, 3])
def test_n_workers_give_the_batches_of_one_in_order(data, workers):
    """Rank 1 of 2 from step 3, across two epoch boundaries (shuffled row groups), and one eval pass."""
    one, many = (
        source(data, eval_fraction=0.2, reader_workers=1),
        source(data, eval_fraction=0.2, reader_workers=workers),
    )
    for a, b in zip(take(one, "train", 1, 2, 14, start=3), take(many, "train", 1, 2, 14, start=3), strict=True):
        assert_batches_equal(a, b)
    evals = take(many, "eval", 0, 1, None)
    assert len(evals) == one.num_batches("eval") > 1
    for a, b in zip(take(one, "eval", 0, 1, None), evals, strict=True):
        assert_batches_equal(a, b)
    assert take(many, "eval", 0, 1, None, start=one.num_batches("eval")) == []


def test_a_resume_with_n_workers_continues_the_uninterrupted_run(data):
    expected = take(source(data, reader_workers=1), "train", 0, 2, 16)  # 10 batches a pass: across a boundary
    first = source(data, reader_workers=3)
    take(first, "train", 0, 2, 6)  # the workers read ahead of step 6: the position is the step's
    resumed = source(data, reader_workers=3)
    assert resumed.resume_position(first.position(6), 6, "ckpt") is None
    for a, b in zip(expected[6:], take(resumed, "train", 0, 2, 10, start=6), strict=True):
        assert_batches_equal(a, b)


def test_a_bad_value_is_raised_at_its_batch_with_n_workers(tmp_path):
    t = table()
    user = t["user"].to_numpy().astype(object)
    user[5 * B + 7] = None  # in batch 5; no statistics: found when read
    t = t.set_column(t.column_names.index("user"), "user", pa.array(list(user), pa.int64()))
    pq.write_table(t, tmp_path / "part-0.parquet", row_group_size=40, write_statistics=False)
    it = source(tmp_path, shuffle=False, reader_workers=3).batches("train", 0, 1)
    got = [rows_of(next(it))[0] for _ in range(5)]
    assert got == [k * B for k in range(5)]
    with pytest.raises(ParquetValueError, match=rf"column 'user' .* is null at .*part-0.parquet, row {5 * B + 7}"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_close_stops_every_worker_and_errors_keep_their_place():
    def make(i: int) -> int:
        if i == 7:
            raise ValueError("item 7")
        return i * i

    before = threading.active_count()
    with OrderedWorkers(make, 2, None, workers=3, depth=2) as it:
        assert [next(it) for _ in range(5)] == [k * k for k in range(2, 7)]
        with pytest.raises(ValueError, match="item 7"):
            next(it)
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
    assert list(OrderedWorkers(lambda i: i, 3, 9, workers=4, depth=1)) == [3, 4, 5, 6, 7, 8]


def test_strings_hashed_per_row_group_equal_strings_hashed_per_batch(data):
    src = source(data)
    reader = RowGroupReader(src.splits["train"].dataset, src.columns)
    raw = reader.group(1).slice(5, 30)
    prepared = src.maker.prepare(reader.group(1)).slice(5, 30)
    assert pa.types.is_int64(prepared["city"].type)
    origin = [(0, "part-0.parquet", 45)]
    assert_batches_equal(src.make_batch(raw, origin), src.make_batch(prepared, origin))
    assert_batches_equal(src.maker.make_batch_by_column(raw, origin), src.maker.make_batch_by_column(prepared, origin))
    lists = pa.table({"city": pa.array([["a", "bb"], [], ["ccc"]])})
    strings = dataclasses.replace(
        config(data), sparse=[dataclasses.replace(config(data).sparse[2], kind=SparseKind.strings)]
    )
    maker = type(src.maker)(strings, ["city"], [64])
    hashed = maker.prepare(lists)["city"].combine_chunks()
    assert hashed.offsets.to_pylist() == [0, 2, 2, 3]
    np.testing.assert_array_equal(
        hashed.values.to_numpy() % 64, maker._feature(lists, origin, 0, strings.sparse[0], 64)[1]
    )


def test_reader_workers_below_zero_are_refused():
    cfg = compose(["model=tiny", *overrides("/nowhere"), "data.parquet.reader_workers=-1"])
    with pytest.raises(ConfigError, match=r"data\.parquet\.reader_workers"):
        validate(cfg)


def test_default_workers_follow_the_cores_per_rank(data, monkeypatch):
    src = source(data)
    monkeypatch.setattr("os.sched_getaffinity", lambda _: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert src.reader_workers(8) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert src.reader_workers(8) == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda _: {0, 1})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert src.reader_workers(2) == 1
    assert source(data, reader_workers=3).reader_workers(2) == 3
