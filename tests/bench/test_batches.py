"""The data path on the host: the multi-hot expansion, done in cache-sized blocks (the host's) or
over all values at once (a GPU's), equals its definition bit for bit; the data-path benchmark
(dlrm.bench.batches): its random Criteo day, the same rows as Parquet giving the same batches, the
sources, its refusals."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dlrm.bench import batches as bench_batches
from dlrm.bench.training import compose_config
from dlrm.config import CriteoConfig
from dlrm.data import multihot
from dlrm.data.criteo.loader import CriteoSource
from dlrm.data.multihot import BaseIdBatch, MultiHotLayout
from dlrm.data.source import feature_layout, make_source

NAMES = [f"C{i + 1}" for i in range(26)]


def _mlperf_layout():
    """Feature names, rows and pooling of MLPerf DLRM-DCNv2 (tables up to 40M rows, up to 100 ids)."""
    return feature_layout(compose_config(["experiment=bench_dcnv2", "topology=cpu"]))


def test_a_batch_expanded_in_blocks_equals_its_slices_expanded_at_once():
    """A feature with more than `_HOST_BLOCK` ids in a batch is expanded in blocks of samples: the
    same numbers as slices small enough to be expanded in one block each."""
    cfg = compose_config(["experiment=bench_dcnv2", "topology=cpu", "data.global_batch_size=9000"])
    source = make_source(cfg, torch.device("cpu"))
    count = 3 * (multihot._HOST_BLOCK // 100) + 808  # C21's 100 ids per sample: four blocks, the last short
    whole = source.samples("eval", 777, count)
    parts = [source.samples("eval", 777 + a, min(1000, count - a)) for a in range(0, count, 1000)]
    assert torch.equal(whole.dense_features, torch.cat([p.dense_features for p in parts]))
    assert whole.dense_features.is_contiguous() and whole.dense_features.dtype == torch.float32
    assert torch.equal(whole.labels, torch.cat([p.labels for p in parts]))
    kjt = whole.sparse_features
    for key in kjt.keys():
        assert torch.equal(kjt[key].values(), torch.cat([p.sparse_features[key].values() for p in parts])), key


@pytest.mark.parametrize("scale", [1, 2**12])  # int32 sums; int64 (tables of up to 2**37 rows)
def test_the_blocked_host_expansion_is_base_plus_offsets_mod_rows(scale):
    names, rows, pooling = _mlperf_layout()
    rows = [r * scale for r in rows]
    count = multihot._HOST_BLOCK // 100 + 77  # C21 (100 ids) takes two blocks, the second short
    offsets = [[0] + [1 + (7919 * j) % (r - 1) if r > 1 else 0 for j in range(1, p)] for r, p in zip(rows, pooling)]
    layout = MultiHotLayout(names, rows, offsets, count, torch.device("cpu"))
    gen = torch.Generator().manual_seed(scale)
    base = torch.stack([torch.randint(0, r, (count,), generator=gen) for r in rows])
    base[:, 0], base[:, 1] = 0, torch.tensor(rows) - 1  # both ends of every table
    expected = torch.cat(
        [((base[f, :, None] + torch.tensor(o)) % r).reshape(-1) for f, (o, r) in enumerate(zip(offsets, rows))]
    )
    for got in (layout.expand(base), layout.expand(base.to(torch.int32)) if scale == 1 else layout.expand(base)):
        assert got.dtype == layout.id_dtype and torch.equal(got.long(), expected)
    # The device's expansion (a GPU's `expand`), run here on the host: the same values, from [F, B]
    # base ids of any strides (BaseIdBatch hands it the transpose of its [B, F] ids).
    sums = base.to(layout._sum_dtype)
    for ids in (sums, sums.t().contiguous().t()):
        assert torch.equal(layout._expand_gathered(ids).long(), expected)
    host = layout.expand_host(np.asfortranarray(base.t().numpy()))  # the loader's [B, 26] rows, any strides
    assert host.dtype == layout.id_dtype and torch.equal(host.long(), expected)


def test_the_random_day_is_a_valid_preprocessed_directory(tmp_path):
    rows = [3, 40_000_000, *[1000 + i for i in range(24)]]
    bench_batches.write_random_day(tmp_path, 100, rows)
    sizes = [1, 3, *[2] * 24]
    source = CriteoSource(CriteoConfig(dir=str(tmp_path), train_days=[0], multi_hot_sizes=sizes), NAMES, rows, 20, 0)
    batch = next(source.batches("train", 1, 2))  # checksums verified, every id below its table
    assert not isinstance(batch, BaseIdBatch) and batch.dense_features.shape == (10, 13)
    kjt = batch.sparse_features
    assert kjt.values().numel() == 10 * sum(sizes) and kjt.values().dtype == torch.int32
    ids = np.load(tmp_path / "day_0_sparse.npy")
    assert ids.dtype == np.int32 and (ids < np.asarray(rows)).all() and (ids >= 0).all() and ids[:, 1].max() > 2**20
    with pytest.raises(Exception, match="26 single-feature tables"):
        bench_batches.write_random_day(tmp_path, 10, [10] * 3)


@pytest.mark.parametrize(("layout", "group_rows"), [("base", 48), ("lists", 48), ("base", 144)])
@pytest.mark.parametrize("rank", [0, 1])
def test_the_parquet_day_gives_the_criteo_sources_batches(tmp_path, rank, layout, group_rows):
    """The random day written as Parquet (row groups of a rank's batch or 3; base: the day's ids, expanded
    by the source, data.parquet.multi_hot_sizes; lists: list<int> of the multi-hot ids) and read by
    ParquetSource gives, step by step, the batches CriteoSource makes from the .npy day: the same
    dense features, labels, keys, ids (expanded) and lengths, into the next epoch."""
    cfg = compose_config(["experiment=bench_dcnv2", "topology=cpu", "data.global_batch_size=96"])
    rows, per_rank, steps = 3 * 96 + 40, 48, 4  # 3 global batches (the rest dropped); step 3 starts epoch 1
    got = {}
    for source in ("criteo", "parquet"):
        bench_batches.use_random_day(cfg, source, tmp_path, rows, group_rows, layout)
        batches = make_source(cfg, torch.device("cpu")).batches("train", rank, 2)
        got[source] = [next(batches) for _ in range(steps)]
    parquet = pq.ParquetFile(tmp_path / "parquet" / "day_0.parquet")
    assert parquet.metadata.num_rows == rows and parquet.metadata.num_row_groups == -(-rows // group_rows)
    assert pa.types.is_list(parquet.schema_arrow.field("C21").type) == (layout == "lists")
    assert parquet.schema_arrow.field("C3").type == "int32"
    assert (cfg.data.parquet.multi_hot_sizes is not None) == (layout == "base")
    _, _, pooling = feature_layout(cfg)
    for step, (want, have) in enumerate(zip(got["criteo"], got["parquet"], strict=True)):
        assert not isinstance(want, BaseIdBatch) and want.dense_features.shape == (per_rank, 13)
        assert have.dense_features.dtype == torch.float32 and torch.equal(have.dense_features, want.dense_features)
        assert have.labels.dtype == torch.float32 and torch.equal(have.labels, want.labels), step
        w, h = want.sparse_features, have.sparse_features
        assert h.keys() == w.keys() and h.values().dtype == w.values().dtype == torch.int32
        assert torch.equal(h.values(), w.values()) and torch.equal(h.lengths().long(), w.lengths().long()), step
        assert h.lengths().long().tolist() == [p for p in pooling for _ in range(per_rank)]  # 214 ids a sample
    first, second = got["parquet"][0].sparse_features.values(), got["parquet"][1].sparse_features.values()
    assert not torch.equal(first, second) and torch.equal(got["parquet"][3].sparse_features.values(), first)


def test_the_parquet_day_has_row_groups_of_the_size_asked_for(tmp_path, monkeypatch):
    """--row-group-rows: the Parquet day is written in row groups of that many rows (the batches are the
    same whatever the row groups: `test_the_parquet_day_gives_the_criteo_sources_batches`)."""
    sizes = {}
    write = bench_batches.write_parquet_day

    def recording(day, out, pooling, table_rows, row_group_rows, lists=False):
        sizes[out.parent.name] = row_group_rows
        return write(day, out, pooling, table_rows, row_group_rows, lists)

    monkeypatch.setattr(bench_batches, "write_parquet_day", recording)
    got = {}
    for group_rows in (0, 192):  # one rank's batch (64), three of them
        out = tmp_path / f"g{group_rows}.json"
        bench_batches.main(["--sources", "parquet", "--ranks", "1", "--rows", "1280",
                            "--row-group-rows", str(group_rows), "--warmup", "0", "--window", "1", "--windows", "1",
                            "--out", str(out), "data.global_batch_size=64"])  # fmt: skip
        got[group_rows] = json.loads(out.read_text())["parquet"]
    assert sorted(sizes.values()) == [64, 192]
    assert got[0]["samples_per_rank"] == got[192]["samples_per_rank"] == 64
    assert got[192]["bytes_on_disk"] < got[0]["bytes_on_disk"]  # fewer row groups: less metadata


def test_the_sources_at_the_mlperf_shape_report_against_the_target(tmp_path, capsys):
    out = tmp_path / "batches.json"
    bench_batches.main(["--ranks", "2", "--rows", "640", "--warmup", "0", "--window", "1", "--windows", "2",
                        "--threads", "1", "--out", str(out), "data.global_batch_size=128"])  # fmt: skip
    result = json.loads(out.read_text())
    assert set(result) == {"synthetic", "criteo", "parquet"}
    for source, r in result.items():
        assert r["source"] == source and r["device"] == "cpu" and r["samples_per_rank"] == 64
        assert r["ids_per_sample"] == 214 and r["features"] == 26  # MLPerf DLRM-DCNv2's multi-hot sizes
        assert len(r["source_samples_per_s_windows"]) == 2 and r["source_samples_per_s_per_rank"] > 0
        assert r["fraction_of_target"] == pytest.approx(r["source_samples_per_s_per_rank"] / 3e6)
    printed = capsys.readouterr().out
    assert "synthetic: 64 samples per process (2 ranks), 214 ids per sample, 1 thread(s): " in printed
    assert "criteo: 64 samples per process" in printed and "of 3M" in printed
    assert (
        "parquet: 64 samples per process (2 ranks), 214 ids per sample, 1 thread(s), default reader worker(s)"
        in printed
    )
    assert result["criteo"]["bytes_on_disk"] > 0 and result["parquet"]["bytes_on_disk"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sources", "synthetic,files"], "--sources 'synthetic,files'"),
        (["--windows", "0"], "--window, --windows, --rows >= 1"),
        (["--threads", "-1"], "--threads, --warmup, --row-group-rows must be >= 0"),
        (["--row-group-rows", "-8"], "--threads, --warmup, --row-group-rows must be >= 0"),
        (["--rows", "100"], "--rows 100: at least one global batch (65536)"),
        (
            ["--rows", "262144", "--reader-workers", "1"],
            "--rows 262144: more than 4 global batches and row groups (65536 rows) for parquet",
        ),
        (
            ["--row-group-rows", "131072", "--reader-workers", "1"],
            "--rows 393216: more than 4 global batches and row groups (131072 rows)",
        ),
        (["--reader-workers", "1,3"], "--rows 393216: more than 6 global batches and row groups"),  # 4 + 3 - 1 cached
        (["--reader-workers", "1,x"], "--reader-workers '1,x': comma-separated counts >= 0"),
    ],
)
def test_bad_options_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench_batches.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
