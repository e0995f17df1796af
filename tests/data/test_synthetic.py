"""Synthetic data: exact per-sample determinism, the same global batch for any world size."""

import numpy as np
import pytest
import torch

from dlrm.data import synthetic
from dlrm.data.multihot import MultiHotLayout
from dlrm.data.source import batches_on, feature_layout, make_source
from dlrm.data.synthetic import SyntheticSource, mix32_


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


# The MLPerf DLRM-DCNv2 multi-hot sizes, on small tables (a few of them 1-, 3- and 4-row ones).
MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
ROWS = [4000, 3906, 1729, 742, 2026, 3, 712, 154, 63, 4000, 3067, 405, 10, 220, 1193, 155, 4, 976, 14, 4000,
        4000, 4000, 590, 129, 1, 36]  # fmt: skip


def _multi_hot_source(cfg, batch: int, seed: int = 0, device=None) -> SyntheticSource:
    names = [f"C{i + 1}" for i in range(26)]
    return SyntheticSource(cfg.data.synthetic, names, ROWS, MULTI_HOT, 13, batch, seed, eval_batches=2, device=device)


def testmix32_is_exact_in_int64_and_a_bijection():
    """The tensor hash (in place, int64) equals the Python-int one, bit for bit, on [0, 2**32)."""
    xs = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
    xs += torch.randint(0, 2**32, (5000,), generator=torch.Generator().manual_seed(0)).tolist()
    t = torch.tensor(xs, dtype=torch.int64)
    assert synthetic.mix32(t.clone()).tolist() == [synthetic.mix32(x) for x in xs]
    assert mix32_(t.clone()).tolist() == [synthetic.mix32(x) for x in xs]
    block = torch.arange(2**20, dtype=torch.int64) * 4093  # distinct inputs, distinct outputs
    assert mix32_(block).unique().numel() == 2**20


def test_multi_hot_ids_are_base_plus_fixed_offsets(make_config):
    cfg = make_config("model=tiny")
    source = _multi_hot_source(cfg, 64)
    kjt = source.samples("train", 0, 64).sparse_features
    assert kjt.values().dtype == torch.int32 and kjt.lengths().dtype == torch.int32
    assert torch.equal(kjt.offsets()[1:], kjt.lengths().cumsum(0).to(torch.int32)) and int(kjt.offsets()[0]) == 0
    assert kjt.length_per_key() == [64 * p for p in MULTI_HOT] and kjt.stride() == 64
    for f, (name, rows, pool) in enumerate(zip(kjt.keys(), ROWS, MULTI_HOT)):
        ids = kjt[name].values().long().view(64, pool)
        assert torch.all(kjt[name].lengths() == pool)
        assert int(ids.min()) >= 0 and int(ids.max()) < rows
        offsets = torch.tensor(source.offsets[f])
        assert torch.equal(ids, (ids[:, :1] + offsets) % rows)  # id j = (base + offset_j) mod rows
    # The constant parts are made once per batch size and shared (read-only) by the batches.
    again = source.samples("train", 64, 64).sparse_features
    assert again.lengths() is kjt.lengths() and not torch.equal(again.values(), kjt.values())


@pytest.mark.parametrize("threads", [1, 2])
def test_multi_hot_global_batch_is_the_same_for_any_world_size(make_config, threads):
    """Bit-identical samples wherever they fall in a batch: sizes chosen so that slices cut CPU kernels'
    vector loops at different places (scalar tails), on one and two intra-op threads."""
    cfg = make_config("model=tiny")
    source = _multi_hot_source(cfg, 2520)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reference = _concat([next(iter(source.batches("train", 0, 1, start_step=1)))])
        for world in (4, 7, 9):
            got = _concat([next(iter(source.batches("train", r, world, start_step=1))) for r in range(world)])
            assert torch.equal(got[0], reference[0]) and torch.equal(got[1], reference[1])
            assert all(torch.equal(got[2][k], reference[2][k]) for k in reference[2])
    finally:
        torch.set_num_threads(previous)


def test_the_numbers_do_not_depend_on_the_device_argument(make_config):
    """device=None and an explicit CPU device make the same batch (on CUDA the same ops, see the module)."""
    cfg = make_config("model=tiny")
    a = _multi_hot_source(cfg, 32).samples("eval", 5, 32)
    b = _multi_hot_source(cfg, 32, device=torch.device("cpu")).samples("eval", 5, 32)
    assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert a.dense_features.device.type == a.sparse_features.values().device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_batch_made_on_cuda_equals_the_hosts(make_config):
    """The module's claim on a GPU: the same samples bit for bit, the multi-hot ids expanded there by
    the device's expansion (the host uses its blocked one)."""
    cfg = make_config("model=tiny")
    host = _multi_hot_source(cfg, 512).samples("eval", 5, 512)
    cuda = _multi_hot_source(cfg, 512, device=torch.device("cuda")).samples("eval", 5, 512)
    assert cuda.sparse_features.values().device.type == "cuda"
    assert torch.equal(cuda.dense_features.cpu(), host.dense_features) and torch.equal(cuda.labels.cpu(), host.labels)
    assert torch.equal(cuda.sparse_features.values().cpu(), host.sparse_features.values())


def test_distributions_dense_normal_labels_learnable(make_config):
    """Dense features ~ N(0, 1) (tails cut near 3.7 sigma); ids follow a power law; the label depends on
    the hidden model (its logit separates the classes) at a plausible click rate."""
    cfg = make_config("model=tiny")
    source = _multi_hot_source(cfg, 20000)
    batch = source.samples("train", 0, 20000)
    dense = batch.dense_features
    assert abs(dense.mean().item()) < 0.02 and abs(dense.std().item() - 1.0) < 0.02
    assert 3.0 < dense.abs().max().item() < 4.0
    ids = batch.sparse_features["C1"].values().long().view(20000, 3)[:, 0]
    counts = torch.bincount(ids, minlength=4000).float()
    assert counts.max() > 50 * counts.mean()
    assert 0.15 < batch.labels.mean().item() < 0.5


def test_eval_and_train_streams_differ_and_seed_matters(make_config):
    cfg = make_config("model=tiny")
    train = _multi_hot_source(cfg, 16).samples("train", 0, 16).sparse_features.values()
    evals = _multi_hot_source(cfg, 16).samples("eval", 0, 16).sparse_features.values()
    other = _multi_hot_source(cfg, 16, seed=7).samples("train", 0, 16).sparse_features.values()
    assert not torch.equal(train, evals) and not torch.equal(train, other)


def test_make_source_makes_batches_on_the_training_device_unless_told_not_to(make_config):
    meta = torch.device("meta")  # stands for an accelerator: the constants are made there, no batch
    on = make_source(make_config("model=tiny"), meta)
    off = make_source(make_config("model=tiny", "data.synthetic.on_device=false"), meta)
    assert batches_on(on, meta) and not batches_on(off, meta) and off.device == torch.device("cpu")
    assert not batches_on(object(), meta)  # a source without a device attribute: host batches


@pytest.mark.parametrize("rows", [ROWS, [r * 2**20 for r in ROWS], [2**31 + 5] + ROWS[1:]])
def test_multi_hot_expansion_on_the_host_equals_the_torch_one(rows):
    """The Criteo loader's numpy expansion and the device one give the same ids (int32 and int64 sums)."""
    offsets = [[0] + [1 + (7919 * j) % (r - 1) if r > 1 else 0 for j in range(1, p)] for r, p in zip(rows, MULTI_HOT)]
    layout = MultiHotLayout([f"C{i + 1}" for i in range(26)], rows, offsets, 50, torch.device("cpu"))
    ids = torch.stack([torch.randint(0, r, (50,), generator=torch.Generator().manual_seed(r % 1000)) for r in rows], 1)
    host = layout.expand_host(ids.numpy())
    assert host.dtype == layout.id_dtype and torch.equal(host, layout.expand(ids.t()))
    expected = torch.cat(
        [((ids[:, f, None] + torch.tensor(o)) % r).reshape(-1) for f, (o, r) in enumerate(zip(offsets, rows))]
    )
    assert torch.equal(host.long(), expected)
    one_hot = MultiHotLayout(["C1", "C2"], rows[:2], [[0], [0]], 50, torch.device("cpu"))
    assert torch.equal(one_hot.expand_host(ids[:, :2].numpy()), ids[:, :2].t().reshape(-1).to(one_hot.id_dtype))
