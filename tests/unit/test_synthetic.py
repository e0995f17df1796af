"""Synthetic data: exact per-sample determinism, the same global batch for any world size."""

import numpy as np
import pytest
import torch

from dlrm.data.loader import feature_layout, make_source
from dlrm.data.synthetic import SyntheticSource


def _concat(batches):
    dense = torch.cat([b.dense_features for b in batches])
    labels = torch.cat([b.labels for b in batches])
    per_key = {
        k: torch.cat([b.sparse_features[k].values() for b in batches]) for k in batches[0].sparse_features.keys()
    }
    return dense, labels, per_key


@pytest.mark.parametrize("split", ["train", "eval"])
def test_global_batch_is_the_same_for_any_world_size(make_config, split):
    cfg = make_config("model=tiny", "data.global_batch_size=60")
    source = make_source(cfg)
    reference = None
    for world in (1, 2, 3):
        steps = [
            _concat([next(iter(source.batches(split, r, world, start_step=s))) for r in range(world)]) for s in (0, 3)
        ]
        if reference is None:
            reference = steps
            continue
        for (dense, labels, k), (rd, rl, rk) in zip(steps, reference):
            assert torch.equal(dense, rd) and torch.equal(labels, rl)
            assert all(torch.equal(k[f], rk[f]) for f in rk)


def test_ids_lengths_and_labels(make_config):
    cfg = make_config("model=tiny", "data.global_batch_size=4000")
    names, rows, pooling = feature_layout(cfg)
    batch = next(iter(make_source(cfg).batches("train", 0, 1)))
    assert batch.dense_features.shape == (4000, 13) and batch.labels.shape == (4000,)
    kjt = batch.sparse_features
    assert kjt.keys() == names
    for name, n_rows, pool in zip(names, rows, pooling):
        jt = kjt[name]
        assert torch.all(jt.lengths() == pool)
        assert int(jt.values().min()) >= 0 and int(jt.values().max()) < n_rows
    rate = batch.labels.mean().item()
    assert 0.1 < rate < 0.6, rate
    # Power law: the most frequent id of the biggest table is far above uniform frequency.
    counts = np.bincount(kjt["C1"].values().numpy(), minlength=100)
    assert counts.max() > 10 * counts.mean()


def test_streams_depend_on_seed_and_split(make_config):
    a = make_source(make_config("model=tiny")).samples("train", 0, 16)
    b = make_source(make_config("model=tiny")).samples("train", 0, 16)
    c = make_source(make_config("model=tiny", "seed=1")).samples("train", 0, 16)
    e = make_source(make_config("model=tiny")).samples("eval", 0, 16)
    assert torch.equal(a.dense_features, b.dense_features)
    assert not torch.equal(a.dense_features, c.dense_features)
    assert not torch.equal(a.dense_features, e.dense_features)


def test_eval_is_finite_and_train_endless(make_config):
    source = make_source(make_config("model=tiny", "data.eval_batches=3"))
    assert len(list(source.batches("eval", 0, 1))) == 3
    assert source.num_batches("train") is None


def test_ids_are_int32_when_every_table_fits(make_config):
    cfg = make_config("model=tiny", "data.global_batch_size=8")
    source = make_source(cfg)
    kjt = source.samples("train", 0, 8).sparse_features
    assert kjt.values().dtype == torch.int32 and kjt.lengths().dtype == torch.int32
    huge = SyntheticSource(
        cfg.data.synthetic, ["C1"], [2**31 + 5], [1], 13, global_batch_size=8, seed=0, eval_batches=1
    )
    ids = huge.samples("train", 0, 64).sparse_features.values()
    assert ids.dtype == torch.int64 and int(ids.max()) < 2**31 + 5
