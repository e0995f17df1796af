"""Criteo loader: same global batches on 1, 2, 3 ranks, exact resume, seeded order, multi-hot, id checks, configs."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch

from dlrm.config import CriteoConfig
from dlrm.data.criteo.format import KAGGLE_TABLE_SIZES, MULTI_HOT_SIZES, TB_TABLE_SIZES, ParseOptions
from dlrm.data.criteo.loader import CriteoDataError, CriteoSource
from dlrm.data.criteo.preprocess import preprocess
from dlrm.data.multihot import BaseIdBatch
from tests.helpers.criteo import SAMPLE, needs_sample

pytestmark = needs_sample
NAMES = [f"C{i + 1}" for i in range(26)]
GBS = 12  # divisible by 1, 2, 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Two days: the sample (100 rows) and its first 50 lines (day 1)."""
    d = tmp_path_factory.mktemp("criteo")
    half = d / "half.tsv"
    half.write_text("\n".join(SAMPLE.read_text().split("\n")[:50]))
    preprocess([str(SAMPLE), str(half)], str(d / "out"), ParseOptions("fail", "modulo", tuple(KAGGLE_TABLE_SIZES)))
    return str(d / "out")


def source(data_dir, seed=0, **kw):
    kw.setdefault("train_days", [0])
    return CriteoSource(CriteoConfig(dir=data_dir, **kw), NAMES, list(KAGGLE_TABLE_SIZES), GBS, seed)


def take(it, n):
    out = list(itertools.islice(it, n))
    it.close()
    return out


def global_batch(src, split, world, step, n):
    """Concatenate the ranks' slices of n global batches from `step`: (dense, ids [B, 26], labels)."""
    per_rank = [take(src.batches(split, r, world, start_step=step), n) for r in range(world)]
    out = []
    for k in range(n):
        bs = [per_rank[r][k] for r in range(world)]
        ids = torch.cat([b.sparse_features.values().view(26, -1).T for b in bs])
        out.append((torch.cat([b.dense_features for b in bs]), ids, torch.cat([b.labels for b in bs])))
    return out


def test_batches_have_the_torchrec_shapes_and_the_data(data_dir):
    src = source(data_dir, shuffle=False)
    b = next(src.batches("train", rank=1, world_size=2))
    dense = np.load(os.path.join(data_dir, "day_0_dense.npy"))
    sparse = np.load(os.path.join(data_dir, "day_0_sparse.npy"))
    labels = np.load(os.path.join(data_dir, "day_0_labels.npy"))
    assert b.dense_features.dtype == torch.float32 and b.dense_features.shape == (6, 13)
    assert b.labels.dtype == torch.float32 and b.labels.shape == (6,)
    kjt = b.sparse_features
    assert (
        kjt.keys() == NAMES and kjt.values().dtype == torch.int32 and kjt.lengths().dtype == torch.int32
    )  # tables fit int32
    assert kjt.lengths().tolist() == [1] * (26 * 6)
    assert torch.equal(b.dense_features, torch.from_numpy(dense[6:12]))
    assert torch.equal(b.labels, torch.from_numpy(labels[6:12, 0].astype(np.float32)))
    assert torch.equal(kjt["C3"].values(), torch.from_numpy(sparse[6:12, 2].astype(np.int64)))


def test_same_global_batches_on_1_2_3_ranks(data_dir):
    src = source(data_dir, seed=3, train_days=[0, 1])  # 150 rows -> 12 batches; batch 8 spans both days
    assert src.num_batches("train") == 12
    ref = global_batch(src, "train", 1, 0, 14)  # crosses an epoch
    for world in (2, 3):
        got = global_batch(src, "train", world, 0, 14)
        for a, b in zip(ref, got):
            for x, y in zip(a, b):
                assert torch.equal(x, y), world


def test_order_is_seeded_per_epoch_and_covers_every_batch(data_dir):
    src = source(data_dir, seed=1)
    n = src.num_batches("train")
    e0, e1 = src.batch_order("train", 0), src.batch_order("train", 1)
    assert sorted(e0) == list(range(n)) and not np.array_equal(e0, e1)
    assert np.array_equal(e0, source(data_dir, seed=1).batch_order("train", 0))
    assert not np.array_equal(e0, source(data_dir, seed=2).batch_order("train", 0))
    assert np.array_equal(source(data_dir, shuffle=False).batch_order("train", 5), np.arange(n))


def test_resume_from_step_continues_exactly(data_dir):
    src = source(data_dir, seed=7)
    full = global_batch(src, "train", 2, 0, 20)
    resumed = global_batch(src, "train", 2, 11, 9)
    for a, b in zip(full[11:], resumed):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_eval_is_one_ordered_pass_and_eval_fraction(data_dir):
    src = source(data_dir, eval_days=[1])
    assert src.num_batches("eval") == 50 // GBS
    assert len(list(src.batches("eval", 0, 2))) == 4
    assert len(list(src.batches("eval", 1, 2, start_step=3))) == 1
    held = source(data_dir, eval_fraction=0.25)  # day 0: 75 train rows, 25 eval rows
    assert held.num_batches("train") == 75 // GBS and held.num_batches("eval") == 25 // GBS
    labels = np.load(os.path.join(data_dir, "day_0_labels.npy"))[75:99, 0]
    got = torch.cat([b.labels for b in held.batches("eval", 0, 1)])
    assert torch.equal(got, torch.from_numpy(labels.astype(np.float32)))


def test_multi_hot_is_deterministic_and_in_range(data_dir):
    src = source(data_dir, shuffle=False, multi_hot_sizes=list(MULTI_HOT_SIZES))
    b = next(src.batches("train", 0, 1))
    kjt = b.sparse_features
    assert kjt.lengths().tolist() == [m for m in MULTI_HOT_SIZES for _ in range(GBS)]
    sparse = np.load(os.path.join(data_dir, "day_0_sparse.npy"))[:GBS]
    for c, name in enumerate(NAMES):
        v = kjt[name].values().view(GBS, MULTI_HOT_SIZES[c])
        assert torch.equal(v[:, 0], torch.from_numpy(sparse[:, c].astype(np.int64)))  # the one-hot id first
        assert int(v.max()) < KAGGLE_TABLE_SIZES[c] and int(v.min()) >= 0
    again = next(source(data_dir, shuffle=False, multi_hot_sizes=list(MULTI_HOT_SIZES)).batches("train", 0, 1))
    assert torch.equal(again.sparse_features.values(), kjt.values())
    # rank slices of multi-hot batches still concatenate to the global batch
    halves = [next(src.batches("train", r, 2)).sparse_features for r in range(2)]
    for name in NAMES:
        assert torch.equal(torch.cat([h[name].values() for h in halves]), kjt[name].values())


def test_multi_hot_expanded_when_moved_equals_the_host_expansion(data_dir):
    """With expand_on (a GPU in training; the CPU here), batches carry one base id per feature and
    expand when moved, as TorchRec's pipeline moves them: the same batch as the host expansion."""
    kw = dict(train_days=[0], shuffle=False, multi_hot_sizes=list(MULTI_HOT_SIZES))
    host = take(source(data_dir, **kw).batches("train", 1, 2), 3)
    cpu = torch.device("cpu")
    lazy_source = CriteoSource(CriteoConfig(dir=data_dir, **kw), NAMES, list(KAGGLE_TABLE_SIZES), GBS, 0, expand_on=cpu)
    for expected, lazy in zip(host, take(lazy_source.batches("train", 1, 2), 3), strict=True):
        assert isinstance(lazy, BaseIdBatch) and lazy.base.shape == (GBS // 2, 26)
        assert lazy.sparse_features.values().numel() == GBS // 2 * 26  # one id per feature until moved
        moved = lazy.to(cpu, non_blocking=True)
        assert torch.equal(moved.dense_features, expected.dense_features)
        assert torch.equal(moved.labels, expected.labels)
        got, want = moved.sparse_features, expected.sparse_features
        assert got.keys() == want.keys() and got.values().dtype == want.values().dtype
        assert torch.equal(got.values(), want.values()) and torch.equal(got.lengths(), want.lengths())
        assert torch.equal(got.offsets(), want.offsets())
    one_hot = CriteoSource(CriteoConfig(dir=data_dir, train_days=[0]), NAMES, list(KAGGLE_TABLE_SIZES), GBS, 0, cpu)
    assert not isinstance(next(one_hot.batches("train", 0, 1)), BaseIdBatch)  # nothing to expand


def test_out_of_range_ids_are_refused_at_load_time(data_dir):
    rows = list(KAGGLE_TABLE_SIZES)
    rows[2] = 1000  # the data were hashed into 10,131,227 rows
    match = r"day_0_sparse.npy, row \d+: sparse column C3 \(feature 'C3'\) has id \d+, .*only 1000 rows.*--table-sizes"
    with pytest.raises(CriteoDataError, match=match):
        CriteoSource(CriteoConfig(dir=data_dir, train_days=[0]), NAMES, rows, GBS, 0)


def test_clear_errors(data_dir, tmp_path):
    with pytest.raises(CriteoDataError, match="manifest.json not found"):
        CriteoSource(CriteoConfig(dir=str(tmp_path)), NAMES, list(KAGGLE_TABLE_SIZES), GBS, 0)
    with pytest.raises(CriteoDataError, match=r"data.criteo.eval_days lists day\(s\) \[5\]"):
        source(data_dir, eval_days=[5])
    with pytest.raises(ValueError, match="divisible by the world size"):
        source(data_dir).batches("train", 0, 5)
    with pytest.raises(CriteoDataError, match="less than one global batch"):  # refused when built
        CriteoSource(CriteoConfig(dir=data_dir, train_days=[1]), NAMES, list(KAGGLE_TABLE_SIZES), 64, 0)


def test_configs_compose_and_validate():
    from dlrm.config import validate
    from dlrm.config.compose import compose

    cfg = compose(["experiment=criteo_kaggle"])
    validate(cfg)
    assert cfg.data.source == "criteo" and cfg.data.criteo.eval_fraction > 0
    assert [t.rows for t in cfg.model.tables] == KAGGLE_TABLE_SIZES
    assert [t.name for t in cfg.model.tables] == [f"t_C{i + 1}" for i in range(26)]
    assert cfg.model.bottom_mlp == [512, 256, 64, 16] and cfg.model.top_mlp == [512, 256, 1]
    tb = compose(["data=criteo_1tb"])
    assert tb.data.criteo.eval_days == [23] and tb.data.criteo.train_days == list(range(23))
    mh = compose(["data=criteo_1tb_multihot", "model=mlperf_dcnv2"])
    validate(mh)
    assert mh.data.criteo.multi_hot_sizes == MULTI_HOT_SIZES and mh.data.criteo.eval_days == [23]
    assert [t.rows for t in mh.model.tables] == TB_TABLE_SIZES, "preprocess --table-sizes 1tb fits mlperf_dcnv2"


def test_files_are_readable_by_torchrec(data_dir):
    from torchrec.datasets.criteo import BinaryCriteoUtils

    path = os.path.join(data_dir, "day_0_sparse.npy")
    assert BinaryCriteoUtils.get_shape_from_npy(path) == (100, 26)
    assert np.array_equal(BinaryCriteoUtils.load_npy_range(path, 10, 5), np.load(path)[10:15])


def test_contiguous_data_feed_the_manifest_table_sizes(tmp_path):
    out = str(tmp_path / "c")
    m = preprocess([str(SAMPLE)], out, ParseOptions(), contiguous_min_count=2)
    src = CriteoSource(CriteoConfig(dir=out, train_days=[0]), NAMES, m["table_sizes"], GBS, 0)
    b = next(src.batches("train", 0, 1))
    assert int(b.sparse_features.values().max()) < max(m["table_sizes"])
    small = list(m["table_sizes"])
    small[0] -= 1
    with pytest.raises(CriteoDataError, match="feature 'C1'"):
        CriteoSource(CriteoConfig(dir=out, train_days=[0]), NAMES, small, GBS, 0)
