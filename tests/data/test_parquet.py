"""data.source=parquet: batches equal a direct pyarrow read of the same rows, the same global batches on
any world size, exact resume, the stable string hash, every bad input as one line; convert and inspect."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dlrm.config import ConfigError, ParquetConfig, SparseColumnConfig, validate
from dlrm.config.choices import IdPolicy, SparseKind
from dlrm.config.compose import compose
from dlrm.data import convert, inspect
from dlrm.data.multihot import BaseIdBatch
from dlrm.data.parquet.files import ParquetDataError, ParquetValueError
from dlrm.data.parquet.hashing import hash_strings
from dlrm.data.parquet.reader import RowGroupReader
from dlrm.data.parquet.source import ParquetSource
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cli import assert_one_error, train_in_process
from tests.helpers.pages import run_page
from tests.helpers.parquet_data import ROWS, TABLES, overrides, table, write_dataset
from tests.helpers.parquet_source import NAMES, ROWS_OF, B, assert_batches_equal, rows_of, source


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("parquet")
    write_dataset(d)
    return d


def take(src: ParquetSource, split: str, rank: int, world: int, steps: int, start: int = 0) -> list:
    it = src.batches(split, rank, world, start)
    out = [next(it) for _ in range(steps)]
    it.close()
    return out


def concat(slices: list) -> object:
    """The global batch that rank slices make together."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

    jts = [s.sparse_features.to_dict() for s in slices]
    keys = slices[0].sparse_features.keys()
    weighted = slices[0].sparse_features.weights_or_none() is not None
    kjt = KeyedJaggedTensor.from_jt_dict(
        {
            k: JaggedTensor(
                values=torch.cat([j[k].values() for j in jts]),
                lengths=torch.cat([j[k].lengths() for j in jts]),
                weights=torch.cat([j[k].weights() for j in jts]) if weighted else None,
            )
            for k in keys
        }
    )
    return Batch(
        dense_features=torch.cat([s.dense_features for s in slices]),
        sparse_features=kjt,
        labels=torch.cat([s.labels for s in slices]),
    )


# -- content ---------------------------------------------------------------------------------------


def test_batches_equal_a_direct_read_of_the_same_rows(data):
    src = source(data, shuffle=False, labels=["label", "label2"], weights="items_w")
    direct = pq.read_table(sorted(data.glob("*.parquet")))  # the files in path order, rows in order
    for k, batch in enumerate(take(src, "train", 0, 1, 3)):
        rows = direct.slice(k * B, B)
        assert batch.dense_features.dtype == torch.float32 and batch.dense_features.shape == (B, 2)
        expected_dense = np.stack([rows["pos"].to_numpy(), rows["x"].to_numpy()], 1).astype(np.float32)
        assert np.array_equal(batch.dense_features.numpy(), expected_dense)
        labels = np.stack([rows["label"].to_numpy(), rows["label2"].to_numpy()], 1).astype(np.float32)
        assert batch.labels.shape == (B, 2) and np.array_equal(batch.labels.numpy(), labels)
        kjt = batch.sparse_features
        assert kjt.keys() == NAMES
        per_key = kjt.to_dict()
        assert per_key["user"].lengths().tolist() == [1] * B
        assert per_key["user"].values().tolist() == rows["user"].to_pylist()
        items = rows["items"].to_pylist()
        assert per_key["items"].lengths().tolist() == [len(x) for x in items]
        assert per_key["items"].values().tolist() == [i for x in items for i in x]
        assert 0 in per_key["items"].lengths().tolist(), "the data must hold empty lists"
        weights = [w for x in rows["items_w"].to_pylist() for w in x]
        assert per_key["items"].weights().tolist() == pytest.approx(weights, abs=0)
        assert per_key["user"].weights().tolist() == [1.0] * B  # unweighted features weigh 1
        cities = (hash_strings(rows["city"].combine_chunks()) % TABLES["city"]).tolist()
        assert per_key["city"].values().tolist() == cities
        # key-major: all of user, then all of items, then all of city
        assert kjt.values().tolist() == rows["user"].to_pylist() + [i for x in items for i in x] + cities


def test_one_label_column_gives_labels_of_shape_b(data):
    (batch,) = take(source(data), "train", 0, 2, 1)
    assert batch.labels.shape == (B // 2,) and batch.labels.dtype == torch.float32
    assert batch.sparse_features.weights_or_none() is None


def test_shuffled_epochs_cover_the_train_rows_once_each_and_differ(data):
    src = source(data, eval_fraction=0.2)  # 24 row groups of 40: 5 held out, 760 train rows, 7 batches
    assert (src.num_batches("train"), src.num_batches("eval")) == (7, 2)
    epochs = take(src, "train", 0, 1, 14)
    first = np.concatenate([rows_of(b) for b in epochs[:7]])
    second = np.concatenate([rows_of(b) for b in epochs[7:]])
    held = set(range(ROWS - 200, ROWS))
    assert len(set(first)) == 7 * B and not set(first) & held
    assert not np.array_equal(first, second), "each epoch reorders the row groups"
    evals = take(src, "eval", 0, 1, 2)
    assert np.concatenate([rows_of(b) for b in evals]).tolist() == list(range(ROWS - 200, ROWS - 200 + 2 * B))
    assert len(list(src.batches("eval", 0, 1))) == 2  # one pass


def test_rows_in_order_reads_every_row_once_in_file_order(data):
    """The scorer's read (dlrm.predict): every row in file order even with shuffle on, the last batch
    partial, and --max-rows' first N."""
    src = source(data, batch=1, shuffle=True)
    batches = list(src.rows_in_order(100))
    assert [len(b.labels) for b in batches] == [100] * 9 + [ROWS - 900]
    np.testing.assert_array_equal(np.concatenate([rows_of(b) for b in batches]), np.arange(ROWS))
    first = list(src.rows_in_order(64, max_rows=150))
    assert [len(b.labels) for b in first] == [64, 64, 22]
    np.testing.assert_array_equal(np.concatenate([rows_of(b) for b in first]), np.arange(150))


@pytest.mark.parametrize("world", [2, 3])
def test_same_global_batches_on_any_world_size(data, world):
    """Rank slices concatenated equal the one-rank batches, across an epoch boundary."""
    one = take(source(data, eval_fraction=0.2), "train", 0, 1, 9)
    src = source(data, eval_fraction=0.2)
    per_rank = [take(src, "train", r, world, 9) for r in range(world)]
    for k in range(9):
        assert_batches_equal(concat([per_rank[r][k] for r in range(world)]), one[k])


def test_start_step_lands_on_the_exact_batch(data):
    src = source(data, eval_fraction=0.2)
    run = take(src, "train", 1, 2, 10)
    for start in (3, 7, 9):  # 7: the second epoch's first batch
        assert_batches_equal(take(src, "train", 1, 2, 1, start)[0], run[start])


def test_eval_path_and_glob(data, tmp_path, monkeypatch):
    write_dataset(tmp_path / "ev", rows=200, files=1)
    src = source(str(data / "part-*.parquet"), eval_path=str(tmp_path / "ev"))
    assert (src.num_batches("train"), src.num_batches("eval")) == (ROWS // B, 2)
    src = source(f"file://{data}")  # a URI opens through pyarrow.fs
    assert src.num_batches("train") == ROWS // B
    monkeypatch.chdir(data)  # a glob relative to the working directory
    assert source("part-1.*").num_batches("train") == ROWS // 2 // B


def test_out_of_range_ids_fold_under_modulo_and_are_counted(data):
    small = [10, 50, 64]  # user ids go to 99: folded into 10 rows
    src = source(data, rows=small, id_policy=IdPolicy.modulo, eval_path=str(data))
    batches = list(src.batches("eval", 0, 1))  # one pass over every row
    users = pq.read_table(sorted(data.glob("*.parquet")))["user"].to_numpy()
    assert torch.cat([b.sparse_features["user"].values() for b in batches]).tolist() == (users % 10).tolist()
    assert src.folded_ids == int((users >= 10).sum()) > 0


# -- blocks: the one-id, dense and label columns read as blocks, as column by column ----------------


def assert_same_batch(a, b) -> None:
    """The same Batch: values, dtypes, shapes, the KJT's lengths, lengths per key and weights."""
    assert_batches_equal(a, b)
    for x, y in ((a.dense_features, b.dense_features), (a.labels, b.labels)):
        assert x.dtype == y.dtype and x.shape == y.shape and x.is_contiguous() and y.is_contiguous()
    ka, kb = a.sparse_features, b.sparse_features
    assert ka.keys() == kb.keys() and ka.stride() == kb.stride() and ka.length_per_key() == kb.length_per_key()
    assert ka.values().dtype == kb.values().dtype and torch.equal(ka.values(), kb.values())
    assert ka.lengths().dtype == kb.lengths().dtype and torch.equal(ka.lengths(), kb.lengths())
    wa, wb = ka.weights_or_none(), kb.weights_or_none()
    assert (wa is None) == (wb is None) and (wa is None or torch.equal(wa, wb))


def tables_of(src: ParquetSource) -> list[pa.Table]:
    """Row groups as batches meet them: whole, sliced (non-zero offsets) and two concatenated (two chunks)."""
    reader = RowGroupReader(src.splits["train"].dataset, src.columns)
    return [reader.group(0), reader.group(1).slice(7, 20), pa.concat_tables([reader.group(2), reader.group(3)])]


@pytest.mark.parametrize("weights", [None, "items_w"])
def test_blocks_equal_column_by_column_on_a_mixed_schema(data, weights):
    """One-id features between list, string and weighted ones (runs of the block), int8 ids, two labels."""
    sparse = [
        SparseColumnConfig(name="user", kind=SparseKind.id),
        SparseColumnConfig(name="u2", column="user", kind=SparseKind.id),
        SparseColumnConfig(name="items", kind=SparseKind.ids, weights=weights),
        SparseColumnConfig(name="u3", column="label2", kind=SparseKind.id),
        SparseColumnConfig(name="city", kind=SparseKind.string),
        SparseColumnConfig(name="u4", column="label", kind=SparseKind.id, weights="x" if weights else None),
    ]
    names, rows = ["user", "u2", "items", "u3", "city", "u4"], [100, 100, 50, 2, 64, 2]
    src = source(data, names=names, rows=rows, sparse=sparse, labels=["label", "label2"])
    assert src.maker._runs == [(0, 2, 0), (2, 3, None), (3, 4, 2), (4, 5, None), (5, 6, None if weights else 3)]
    for t in tables_of(src):
        origin = [(0, "f", 0)]
        assert_same_batch(src.make_batch(t, origin), src.maker.make_batch_by_column(t, origin))


def test_the_string_features_hashed_together_equal_each_hashed_alone(tmp_path):
    """`make_batch` hashes every string feature of a batch in one call (strings of several lengths, a
    list<string> column with empty lists, one column read by two features); column by column hashes
    each alone: the same ids, over whole, sliced and two-chunk row groups."""
    n, rng = 120, np.random.default_rng(5)
    words = ["", "a", "paris", "lyon", "marseille", "x" * 40, "été", "東京"]
    t = pa.table(
        {
            "d": rng.normal(size=n),
            "y": pa.array(rng.integers(0, 2, n).astype(np.int8)),
            "u": pa.array(rng.integers(0, 50, n)),
            "city": [words[k] for k in rng.integers(0, len(words), n)],
            "tags": [[words[k] for k in rng.integers(0, len(words), rng.integers(0, 4))] for _ in range(n)],
            "shop": [f"s{k}" * int(k % 5) for k in rng.integers(0, 1000, n)],
        }
    )
    write(tmp_path / "a.parquet", t, row_group_size=30)
    sparse = [
        SparseColumnConfig(name="city", kind=SparseKind.string),
        SparseColumnConfig(name="u", kind=SparseKind.id),
        SparseColumnConfig(name="tags", kind=SparseKind.strings),
        SparseColumnConfig(name="shop", kind=SparseKind.string),
        SparseColumnConfig(name="city2", column="city", kind=SparseKind.string),
    ]
    cfg = ParquetConfig(path=str(tmp_path), dense=["d"], sparse=sparse, labels=["y"])
    src = ParquetSource(cfg, ["city", "u", "tags", "shop", "city2"], [64, 50, 1000, 7, 2**40], 30, 0)
    for table_ in tables_of(src):
        origin = [(0, "f", 0)]
        assert_same_batch(src.make_batch(table_, origin), src.maker.make_batch_by_column(table_, origin))


@pytest.mark.parametrize("big", [False, True])  # int32 ids; int64 (a table of more than 2**31 rows)
def test_blocks_equal_column_by_column_on_one_id_columns_only(tmp_path, big):
    n, rng = 200, np.random.default_rng(3)
    t = pa.table(
        {
            "d_f64": rng.normal(size=n),
            "d_i32": pa.array(rng.integers(-5, 5, n).astype(np.int32)),
            "d_null": pa.array([None if k % 7 == 0 else float(k) for k in range(n)], pa.float32()),
            "a": pa.array(rng.integers(0, 90, n).astype(np.int32)),
            "b": pa.array(rng.integers(0, 90, n) + (2**40 if big else 0)),
            "c": pa.array(rng.integers(0, 90, n).astype(np.uint16)),
            "y": pa.array(rng.integers(0, 2, n).astype(bool)),
        }
    )
    write(tmp_path / "a.parquet", t, row_group_size=50)
    rows = [90, 2**41 if big else 90, 90]
    sparse = [SparseColumnConfig(name=c, kind=SparseKind.id) for c in "abc"]
    cfg = ParquetConfig(path=str(tmp_path), dense=["d_f64", "d_i32", "d_null"], sparse=sparse, labels=["y"])
    src = ParquetSource(cfg, ["c", "a", "b"], [rows[2], rows[0], rows[1]], 50, 0)
    assert src.maker._runs == [(0, 3, 0)] and src.maker.id_dtype == (np.int64 if big else np.int32)
    for table_ in tables_of(src):
        origin = [(0, "f", 0)]
        batch = src.make_batch(table_, origin)
        assert_same_batch(batch, src.maker.make_batch_by_column(table_, origin))
        assert batch.sparse_features.lengths().tolist() == [1] * 3 * table_.num_rows
    folding = ParquetSource(dataclasses.replace(cfg, id_policy=IdPolicy.modulo), ["a", "b", "c"], [90, 50, 90], 50, 0)
    first = tables_of(folding)[0]
    origin = [(0, "f", 0)]
    assert folding.maker._blocks(first, origin) is not None  # ids of b >= 50: folded in the block
    by_block = folding.maker.folded_ids
    assert by_block > 0
    assert_same_batch(folding.make_batch(first, origin), folding.maker.make_batch_by_column(first, origin))
    assert folding.maker.folded_ids == 3 * by_block  # the block, make_batch's block, and column by column alike


def test_multi_hot_sizes_expand_one_base_id_per_sample_as_the_criteo_source(tmp_path):
    """data.parquet.multi_hot_sizes: id j of a sample is (base + offset_j) % rows, the Criteo source's
    offsets; out-of-range base ids folded first (id_policy=modulo) or named (refuse)."""
    from dlrm.data.criteo.loader import multi_hot_offsets

    n, rng = 120, np.random.default_rng(5)
    base = {"a": rng.integers(0, 90, n), "b": rng.integers(0, 50, n).astype(np.int32)}
    write(tmp_path / "a.parquet", pa.table({**base, "d": rng.random(n), "y": rng.integers(0, 2, n)}), row_group_size=40)
    sparse = [SparseColumnConfig(name="a"), SparseColumnConfig(name="b")]
    cfg = ParquetConfig(path=str(tmp_path), dense=["d"], sparse=sparse, labels=["y"], shuffle=False)
    for rows, policy in (([90, 50], IdPolicy.refuse), ([60, 50], IdPolicy.modulo)):
        multi = dataclasses.replace(cfg, multi_hot_sizes=[3, 1], id_policy=policy)
        batches = take(ParquetSource(multi, ["a", "b"], rows, 40, 0), "train", 0, 1, 3)
        offsets = multi_hot_offsets([3, 1], rows)
        for k, batch in enumerate(batches):
            kjt, at = batch.sparse_features, slice(40 * k, 40 * (k + 1))
            expected = [((base[f][at, None] % r + o) % r).reshape(-1) for f, r, o in zip("ab", rows, offsets)]
            assert kjt.values().dtype == torch.int32 and kjt.values().tolist() == np.concatenate(expected).tolist()
            assert kjt.lengths().tolist() == [3] * 40 + [1] * 40 and batch.labels.shape == (40,)
        lazy = take(ParquetSource(multi, ["a", "b"], rows, 40, 0, expand_on=torch.device("cpu")), "train", 0, 1, 3)
        for want, got in zip(batches, lazy, strict=True):  # expanded where moved (the GPU), the same batch
            assert isinstance(got, BaseIdBatch) and got.base.shape == (40, 2)
            assert_same_batch(got.to(torch.device("cpu")), want)
    with pytest.raises(ParquetValueError, match="'a'.*holds id"):
        ParquetSource(dataclasses.replace(cfg, multi_hot_sizes=[3, 1]), ["a", "b"], [60, 50], 40, 0)
    with pytest.raises(ParquetDataError, match="multi_hot_sizes"):
        ParquetSource(dataclasses.replace(cfg, multi_hot_sizes=[3]), ["a", "b"], [90, 50], 40, 0)


@pytest.mark.parametrize(
    ("sparse", "sizes", "words"),
    [
        ("[{name:user},{name:items,kind:ids},{name:city,kind:string}]", "[1,2,1]", "['items', 'city'] are not"),
        ("[{name:user},{name:items},{name:city}]", "[1,2]", "one size per model feature"),
        ("[{name:user},{name:items},{name:city}]", "[1,0,1]", "one size >= 1"),
    ],
)
def test_config_refuses_multi_hot_sizes_it_cannot_expand(sparse, sizes, words):
    cfg = compose(["model=tiny", *overrides("/nowhere"), f"data.parquet.sparse={sparse}"])
    cfg.data.parquet.multi_hot_sizes = [int(x) for x in sizes.strip("[]").split(",")]
    with pytest.raises(ConfigError, match=re.escape(words)):
        validate(cfg)


# -- the string hash ---------------------------------------------------------------------------------

STRINGS = ["", "a", "city-7", "naïve ☃", "x" * 300]


def reference_hash(s: str) -> int:
    """FNV-1a 64 of the UTF-8 bytes, splitmix64's finaliser, the top bit cleared: plain Python."""
    m = 2**64 - 1
    h = 0xCBF29CE484222325
    for byte in s.encode():
        h = ((h ^ byte) * 0x100000001B3) & m
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & m
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & m
    return (h ^ (h >> 31)) & (2**63 - 1)


def test_string_hash_is_the_documented_function_and_slice_safe():
    arr = pa.array(["pad", *STRINGS])
    assert hash_strings(arr.slice(1)).tolist() == [reference_hash(s) for s in STRINGS]
    assert hash_strings(pa.chunked_array([arr[:2], arr[2:]])).tolist() == [reference_hash(s) for s in ["pad", *STRINGS]]


def test_string_hash_is_the_same_in_another_process():
    code = (
        "import pyarrow as pa, sys; from dlrm.data.parquet.hashing import hash_strings; "
        f"print(hash_strings(pa.array({STRINGS!r})).tolist())"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(hash_strings(pa.array(STRINGS)).tolist())


# -- bad inputs: one line naming the file and column -------------------------------------------------


def write(path: Path, t: pa.Table, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path, **kw)
    return path


def with_column(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, values)


def bad_dataset(tmp_path: Path, case: str, statistics: bool = True) -> tuple[Path, dict]:
    """A dataset with one defect, and the source's keyword arguments; `statistics`: Parquet's column
    statistics written in the files (pyarrow's default) or not."""
    t, d, kw = table(200), tmp_path / case, {}
    if case == "missing column":
        write(d / "a.parquet", t.drop_columns(["city"]))
    elif case == "list declared scalar":
        kw["sparse"] = [SparseColumnConfig(name="user", column="items", kind=SparseKind.id)]
        write(d / "a.parquet", t)
    elif case == "scalar declared list":
        kw["sparse"] = [SparseColumnConfig(name="user", kind=SparseKind.ids)]
        write(d / "a.parquet", t)
    elif case == "null id":
        write(
            d / "a.parquet",
            with_column(t, "user", pa.array([1] * 150 + [None] + [1] * 49, pa.int64())),
            write_statistics=statistics,
        )
    elif case == "null in a list":
        items = pa.array([[1, 2]] * 120 + [[3, None]] + [[]] * 79, pa.list_(pa.int64()))
        write(d / "a.parquet", with_column(t, "items", items))
    elif case == "negative id":
        write(
            d / "a.parquet",
            with_column(t, "user", pa.array([1] * 130 + [-4] + [1] * 69, pa.int64())),
            write_statistics=statistics,
        )
    elif case == "id beyond the table":
        write(
            d / "a.parquet",
            with_column(t, "user", pa.array([1] * 130 + [100] + [1] * 69, pa.int64())),
            write_statistics=statistics,
        )
    elif case == "label outside 0/1":
        write(
            d / "a.parquet",
            with_column(t, "label", pa.array([0] * 110 + [2] + [1] * 89, pa.int64())),
            write_statistics=statistics,
        )
    elif case == "null label":
        write(
            d / "a.parquet",
            with_column(t, "label", pa.array([0] * 110 + [None] + [1] * 89, pa.int64())),
            write_statistics=statistics,
        )
    elif case == "empty file":
        write(d / "a.parquet", t)
        write(d / "b.parquet", t.slice(0, 0))
    elif case == "empty dataset":
        d.mkdir(parents=True)
        (d / "notes.txt").write_text("no parquet here")
    elif case == "schemas differ":
        write(d / "a.parquet", t)
        write(d / "b.parquet", with_column(t, "user", t["user"].cast(pa.string())))
    elif case == "truncated file":
        good = write(d / "a.parquet", t).read_bytes()
        (d / "b.parquet").write_bytes(good[: len(good) // 2])
    elif case == "not parquet":
        write(d / "a.parquet", t)
        (d / "b.parquet").write_text("label,user\n1,2\n")
    return d, kw


BAD = {  # case -> words the one line holds
    "missing column": ["a.parquet", "'city'", "data.parquet.sparse[2].column"],
    "list declared scalar": ["'items'", "declare kind: ids"],
    "scalar declared list": ["'user'", "declare kind: id"],
    "null id": ["'user'", "a.parquet, row 150", "null"],
    "null in a list": ["'items'", "a.parquet, row 120", "null id"],
    "negative id": ["'user'", "id -4", "a.parquet, row 130", "id_policy=modulo"],
    "id beyond the table": ["'user'", "id 100", "a.parquet, row 130", "[0, 100)"],
    "label outside 0/1": ["'label'", "holds 2", "a.parquet, row 110"],
    "null label": ["'label'", "null", "a.parquet, row 110"],
    "empty file": ["b.parquet", "no rows"],
    "empty dataset": ["no Parquet files"],
    "schemas differ": ["'user'", "b.parquet", "schemas differ"],
    "truncated file": ["b.parquet", "not a readable Parquet file"],
    "not parquet": ["b.parquet", "not a readable Parquet file"],
}


VALUE_CASES = {"null id", "null in a list", "negative id", "id beyond the table", "label outside 0/1", "null label"}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_naming_file_and_column(tmp_path, case):
    d, kw = bad_dataset(tmp_path, case)
    names, rows = (["user"], [100]) if "sparse" in kw else (NAMES, ROWS_OF)
    with pytest.raises(ParquetDataError) as e:
        src = source(d, batch=200, names=names, rows=rows, shuffle=False, **kw)
        assert case == "null in a list", "the statistics flag the rest at start-up"
        next(src.batches("train", 0, 1))
    message = str(e.value)
    assert "\n" not in message
    # a bad value is in one rank's rows (each rank says it); a bad file is the same for every rank
    assert isinstance(e.value, ParquetValueError) == (case in VALUE_CASES)
    for word in BAD[case]:
        assert word in message, message


@pytest.mark.parametrize("case", sorted(VALUE_CASES))
def test_bad_values_in_files_without_statistics_are_found_as_batches_are_read(tmp_path, case):
    d, kw = bad_dataset(tmp_path, case, statistics=False)
    src = source(d, batch=200, shuffle=False, **kw)  # nothing in the metadata flags the rows
    with pytest.raises(ParquetValueError) as e:
        next(src.batches("train", 0, 1))  # one batch: every row
    assert "\n" not in str(e.value)
    for word in BAD[case]:
        assert word in str(e.value), str(e.value)


@pytest.mark.slow
def test_a_bad_value_stops_training_with_one_line(tmp_path, capfd):
    """Through `python -m dlrm.train` (in the test process): the reader thread's error is one `error:`
    line, exit 2 (no statistics in the file: the bad id is met as its batch is read, during training)."""
    d, _ = bad_dataset(tmp_path, "negative id", statistics=False)
    args = ["model=tiny", *overrides(d), "data.parquet.eval_fraction=0", "data.global_batch_size=100"]
    args += ["data.eval_batches=0", "trainer.max_steps=2", "trainer.progress=none", f"hydra.run.dir={tmp_path / 'run'}"]
    code, out, err = train_in_process(capfd, *args, cwd=tmp_path)
    assert_one_error(code, out, err, "'user'", "id -4", "row 130")


WEIGHTED_SPARSE = "data.parquet.sparse=[{name:user},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]"
WEIGHTED = ("model.weighted=true", WEIGHTED_SPARSE)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ("data.parquet.sparse=[{name:user},{name:items,kind:ids}]", "data.parquet.sparse"),
        ("data.parquet.dense=[pos]", "data.parquet.dense"),
        ("data.parquet.labels=[label,label2]", "data.parquet.labels"),
        (
            "data.parquet.sparse=[{name:user},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]",
            "weighted=true",
        ),
        ("model.weighted=true", "model.weighted"),
        ("data.parquet.eval_fraction=1.0", "data.parquet.eval_fraction"),
    ],
)
def test_config_refuses_columns_the_model_cannot_take(change, key):
    cfg = compose(["model=tiny", *overrides("/nowhere"), change])
    with pytest.raises(ConfigError, match=key.replace("[", r"\[")):
        validate(cfg)


WEIGHTED = (
    "model.weighted=true",
    "data.parquet.sparse=[{name:user},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]",
)


def test_a_weighted_model_takes_the_declared_weights_and_only_sums():
    validate(compose(["model=tiny", *overrides("/nowhere"), *WEIGHTED]))
    with pytest.raises(ConfigError, match=r"model.tables\[1\].pooling_type.*sum only"):
        validate(compose(["model=tiny", *overrides("/nowhere"), *WEIGHTED, "model.tables.1.pooling_type=mean"]))
    with pytest.raises(ConfigError, match="model.weighted.*no per-id weights"):
        validate(compose(["model=tiny", "model.weighted=true"]))


def test_a_weighted_model_pools_each_row_times_its_weight():
    """The model's bags on a weighted batch: sum_i w_i * row(id_i), against a direct computation."""
    from torchrec import KeyedJaggedTensor

    from dlrm.models.dlrm import build_model

    cfg = compose(["model=tiny", *overrides("/nowhere"), *WEIGHTED])
    ebc = build_model(cfg.model, torch.device("cpu")).model.sparse_arch.embedding_bag_collection
    torch.nn.init.normal_(ebc.embedding_bags["t_items"].weight)
    ids, weights = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0.5, 2.0, 1.0, -1.5, 3.0])
    lengths = torch.tensor([0, 0, 0, 2, 0, 3, 0, 0, 0])  # user, items, city over 3 samples: items only
    kjt = KeyedJaggedTensor(keys=["user", "items", "city"], values=ids, lengths=lengths, weights=weights)
    pooled = ebc(kjt)["items"]
    rows = ebc.embedding_bags["t_items"].weight.detach()
    expected = torch.stack([0.5 * rows[1] + 2.0 * rows[2], torch.zeros(8), rows[3] - 1.5 * rows[4] + 3.0 * rows[5]])
    torch.testing.assert_close(pooled.detach(), expected)


# -- convert and inspect -----------------------------------------------------------------------------

CSV = "clicked,converted,price,user,items,city\n" + "".join(
    f"{i % 2},{i % 3 == 0:d},{i * 0.5},{i % 7},{'|'.join(str((i + k) % 11) for k in range(i % 4))},c{i % 5}\n"
    for i in range(50)
)


def test_convert_writes_lists_files_and_row_groups(tmp_path):
    (tmp_path / "in.csv").write_text(CSV)
    done = convert.convert(
        [str(tmp_path / "in.csv")], str(tmp_path / "out"), multi=["items"], rows_per_file=20, row_group_size=8
    )
    assert done["rows"] == 50 and [Path(f).name for f in done["files"]] == [f"part-0000{i}.parquet" for i in range(3)]
    assert [pq.ParquetFile(f).metadata.num_row_groups for f in done["files"]] == [3, 3, 2]
    t = pq.read_table(done["files"])
    assert t.schema.field("items").type == pa.list_(pa.int64())
    assert t["items"].to_pylist()[:4] == [[], [1], [2, 3], [3, 4, 5]]  # an empty cell: no ids
    assert not list((tmp_path / "out").glob(".*")), "no temporary files left"
    column = pq.ParquetFile(done["files"][0]).metadata.row_group(0).column
    chunks = {column(i).path_in_schema: column(i) for i in range(len(t.schema))}
    assert ["RLE_DICTIONARY" in c.encodings for c in chunks.values()] == [False] * 5 + [True]  # strings only
    assert {c.compression for c in chunks.values()} == {"SNAPPY"}


def test_convert_compression_none_and_required_columns(tmp_path, capsys):
    (tmp_path / "in.csv").write_text(CSV)
    done = convert.convert([str(tmp_path / "in.csv")], str(tmp_path / "out"), compression="none", required=True)
    parquet = pq.ParquetFile(done["files"][0])
    assert parquet.metadata.row_group(0).column(0).compression == "UNCOMPRESSED"
    assert [parquet.schema.column(i).max_definition_level for i in range(5)] == [0] * 5  # REQUIRED: no levels
    assert not any(f.nullable for f in parquet.schema_arrow)
    (tmp_path / "gap.csv").write_text("a,b\n1,2\n3,\n")
    assert convert.main([str(tmp_path / "gap.csv"), "--out", str(tmp_path / "gap"), "--required"]) == 2
    assert_one_error(2, "", capsys.readouterr().err, "gap.csv", "column 'b'", "--required")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--multi", "city"], ["'city'", "COL:string"]),
        (["--multi", "nope"], ["no column", "nope"]),
        (["--delimiter", "ab"], ["--delimiter"]),
        (["--rows-per-file", "0"], ["--rows-per-file"]),
        (["--compression", "rar"], ["--compression 'rar'", "snappy, lz4, zstd, none"]),
    ],
)
def test_convert_errors_are_one_line(tmp_path, capsys, argv, words):
    (tmp_path / "in.csv").write_text(CSV)
    assert convert.main([str(tmp_path / "in.csv"), "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    for w in words:
        assert w in err, err


def test_convert_never_writes_over_parquet_files(tmp_path, capsys):
    (tmp_path / "in.csv").write_text(CSV)
    args = [str(tmp_path / "in.csv"), "--out", str(tmp_path / "out")]
    assert convert.main(args) == 0
    before = (tmp_path / "out" / "part-00000.parquet").read_bytes()
    assert convert.main(args) == 2 and "is not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "out" / "part-00000.parquet").read_bytes() == before


def test_inspect_profiles_columns_and_writes_a_config_that_composes(tmp_path, capsys):
    (tmp_path / "in.csv").write_text(CSV)
    convert.convert([str(tmp_path / "in.csv")], str(tmp_path / "pq"), multi=["items", "city:string"], row_group_size=10)
    argv = [str(tmp_path / "pq"), "--out", str(tmp_path / "conf"), "--label", "clicked", "--ignore", "converted"]
    assert inspect.main(argv) == 0
    out = capsys.readouterr().out
    assert "-cd " in out and "model=mydata data=mydata" in out
    t, total, groups = inspect.sample(str(tmp_path / "pq"), 1000)
    cols = {c.name: c for c in inspect.describe(t, total, ["clicked"], ignore=["converted"])}
    assert (cols["items"].role, cols["items"].max_per_sample, cols["items"].mean_per_sample) == ("ids", 3, 73 / 50)
    assert cols["items"].missing == 13 / 50 and cols["items"].pooling == 1.46  # 73 ids in 50 rows
    assert (cols["city"].role, cols["city"].distinct) == ("strings", 5)
    assert (cols["user"].role, cols["user"].max_id, cols["user"].rows) == ("id", 6, 16)
    assert cols["price"].role == "dense" and cols["clicked"].role == "label"
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dlrm.config import register_configs, to_config
    from dlrm.config.compose import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        searched = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=mydata", "data=mydata"]
        cfg = to_config(hydra_compose(config_name="config", overrides=searched))
    validate(cfg)
    assert cfg.data.parquet.sparse[1].kind == "ids" and cfg.model.tables[1].pooling == 1.46
    from dlrm.distributed.sharding import constraints  # the planner takes the measured pooling factor

    assert constraints(cfg, 2)[cfg.model.tables[1].name].pooling_factors == [1.46]


@pytest.mark.parametrize("ignored", [["price"], ["price", "user", "city"]])
def test_inspect_of_data_without_dense_columns_writes_a_model_without_a_bottom_mlp(tmp_path, capsys, ignored):
    """All-categorical data: model.dense_in_features=0, no bottom MLP; the dot interaction where two
    or more sparse features can be multiplied, else the cross net. The config validates and trains."""
    (tmp_path / "in.csv").write_text(CSV)
    convert.convert([str(tmp_path / "in.csv")], str(tmp_path / "pq"), multi=["items"], row_group_size=10)
    ignore = [arg for column in ["converted", *ignored] for arg in ("--ignore", column)]
    argv = [str(tmp_path / "pq"), "--out", str(tmp_path / "conf"), "--label", "clicked", *ignore]
    assert inspect.main(argv) == 0, capsys.readouterr().err
    from dlrm.config import to_config
    from dlrm.config.compose import compose_job, hydra_session
    from dlrm.data.source import make_source
    from dlrm.models.dlrm import build_model, initialize

    with hydra_session():
        overrides = ["model=mydata", "data=mydata"]
        cfg = to_config(compose_job(overrides, with_hydra=False, config_dir=str(tmp_path / "conf")))
    validate(cfg)
    assert (cfg.model.dense_in_features, cfg.model.bottom_mlp, cfg.data.parquet.dense) == (0, [], [])
    assert cfg.model.interaction == ("dot" if len(ignored) == 1 else "dcn")
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, seed=0)
    batches = make_source(cfg).batches("train", 0, 1)
    batch = next(batches)
    batches.close()
    assert batch.dense_features.shape == (cfg.data.global_batch_size, 0)
    loss, _ = model(batch)
    loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_the_your_data_page_runs_as_written(tmp_path, capfd):
    """docs/your-data.md: its CSV's columns (its rows, then more of the kind), then its commands as they
    are: convert, inspect, train, export, predict."""
    page = (ROOT / "docs" / "your-data.md").read_text()
    csv_lines = page.split("```text\n", 1)[1].split("```", 1)[0].strip().splitlines()
    rng = np.random.default_rng(0)
    rows = [
        f"{rng.integers(0, 2)},{rng.integers(0, 2)},{rng.random() * 5:.2f},{rng.integers(0, 40)},"
        f"{'|'.join(str(v) for v in rng.integers(0, 30, rng.integers(0, 4)))},{rng.choice(['paris', 'lyon', 'nice'])}"
        for _ in range(400)
    ]
    (tmp_path / "clicks.csv").write_text("\n".join(csv_lines + rows) + "\n")
    outputs = run_page("your-data.md", tmp_path, capfd)
    assert "items" in outputs[1] and "ids" in outputs[1]
    assert "done: 20 steps" in outputs[2] and "eval auc" in outputs[2]
    assert "exported" in outputs[3] and (tmp_path / "clicks.pt").is_file()
    assert "scored 403 rows" in outputs[4] and "clicked: auc" in outputs[4] and "converted: auc" in outputs[4]
    scores = np.load(tmp_path / "scores.npy", allow_pickle=False)
    assert scores.shape == (403, 2) and ((scores > 0) & (scores < 1)).all()
