"""The GPU-run options on 2 (or 2 x 2) Gloo ranks: fp16 tables, quantized embedding comms,
compressed dense allreduce, and evaluation scored on rank 0.

Tolerances come from the formats' unit roundoff u (fp16 2^-11 ~ 4.9e-4, bf16 2^-8 ~ 3.9e-3): one
rounding moves a value by at most u relative; over the 8 steps of these runs the losses stay within
a few u of the fp32 run (the bounds below are 4 u), and must still differ from it: the option ran.
"""

import numpy as np
import pytest
import torch

from dlrm.data.loader import make_source
from dlrm.export import export, load_exported
from tests.helpers.equivalence import STEPS, config
from tests.helpers.harness import launch
from tests.helpers.precision_workers import compressed_gradients, score_slices
from tests.helpers.workers import train_and_report, train_summary
from tests.unit.test_precision import numpy_auc

U = {"fp16": 2.0**-11, "bf16": 2.0**-8}
TABLES = "embedding_bags"


def _within_rounding(seen, locals_, u, roundings):
    """|seen - mean| <= roundings * u * mean|g| elementwise: each of the casts and additions in the
    format moves a partial result by at most u of the ranks' mean magnitude (relative bounds fail
    where the ranks' gradients cancel)."""
    stacked = torch.stack(locals_)
    bound = roundings * u * stacked.abs().mean(0) + 1e-12
    assert ((seen - stacked.mean(0)).abs() <= bound).all()


def _close_but_not_equal(losses, reference, precision):
    assert losses != reference, "the option changed no arithmetic: it did not run"
    assert losses == pytest.approx(reference, rel=4 * U[precision])


# --- table weights in fp16 -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
def test_fp16_tables_train_close_to_fp32(make_config, sharding):
    fp32 = launch(train_and_report, 2, config(make_config, f"sharding={sharding}"))
    fp16 = launch(train_and_report, 2, config(make_config, f"sharding={sharding}", "model.embedding_precision=fp16"))
    _close_but_not_equal(fp16[0]["losses"], fp32[0]["losses"], "fp16")
    for rank in range(2):
        for name, pieces in fp16[rank]["pieces"].items():
            reference = dict(fp32[rank]["pieces"][name])
            for offsets, piece in pieces:
                assert piece.dtype == (torch.float16 if TABLES in name else torch.float32), name
                if TABLES in name:  # the initial rounding, then up to 1 ulp (2 u |w|) per stochastically rounded update
                    ulp = 2 * U["fp16"] * reference[offsets].abs().max().item()
                    torch.testing.assert_close(piece.float(), reference[offsets], rtol=0, atol=(STEPS + 1) * ulp)


@pytest.mark.slow
def test_fp16_tables_resume_and_export(make_config, tmp_path):
    """Row-wise Adagrad (fp32 state in fbgemm) with fp16 weights: a resume continues exactly, and the
    export holds the fp16 tables, which the rebuilt unsharded model runs."""

    def cfg(name, *overrides):
        return config(
            make_config,
            "sharding=table_wise",
            "model.embedding_precision=fp16",
            "optim=rowwise_adagrad",
            "trainer.max_steps=8",
            "checkpoint.every_steps=4",
            "checkpoint.keep=3",
            f"checkpoint.dir={tmp_path / name}",
            *overrides,
        )

    whole = launch(train_and_report, 2, cfg("whole"))
    resumed = launch(train_and_report, 2, cfg("again", f"trainer.resume={tmp_path / 'whole' / 'step_00000004'}"))
    assert resumed[0]["losses"] == whole[0]["losses"][4:]
    exported = export(tmp_path / "again" / "step_00000008", tmp_path / "model.pt")
    for result in resumed:
        for name, pieces in result["pieces"].items():
            for (r0, c0), piece in pieces:
                full = exported[name]
                expected = full[r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]] if full.dim() == 2 else full
                assert expected.dtype == piece.dtype and torch.equal(piece, expected), name
    model = load_exported(tmp_path / "model.pt")
    batch = make_source(cfg("x")).samples("eval", 0, 16)
    loss, _ = model(batch)
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_an_fp32_checkpoint_resumes_into_fp16_tables(make_config, tmp_path):
    """The precision may change at a resume: DCP casts the saved fp32 tables into the fp16 ones."""

    def cfg(name, *overrides):
        return config(
            make_config,
            "sharding=table_wise",
            "optim=rowwise_adagrad",
            "checkpoint.every_steps=4",
            f"checkpoint.dir={tmp_path / name}",
            *overrides,
        )

    whole = launch(train_and_report, 2, cfg("fp32"))
    half = cfg("fp16", "model.embedding_precision=fp16", f"trainer.resume={tmp_path / 'fp32' / 'step_00000004'}")
    resumed = launch(train_and_report, 2, half)
    _close_but_not_equal(resumed[0]["losses"], whole[0]["losses"][4:], "fp16")
    tables = [piece for name, pieces in resumed[0]["pieces"].items() if TABLES in name for _, piece in pieces]
    assert tables and all(t.dtype == torch.float16 for t in tables)


# --- quantized embedding comms -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "sharding, forward, backward",
    [
        ("table_wise", "fp16", "fp32"),  # alltoall of the pooled embeddings
        ("table_wise", "fp32", "fp16"),  # alltoall of their gradients
        ("table_wise", "fp16", "fp16"),
        ("row_wise", "fp16", "fp16"),  # reduce-scatter forward, allgather of the gradients backward
    ],
)
def test_quantized_embedding_comms_train_close_to_fp32(make_config, sharding, forward, backward):
    fp32 = launch(train_and_report, 2, config(make_config, f"sharding={sharding}"))[0]["losses"]
    q = ("sharding.qcomms_forward=" + forward, "sharding.qcomms_backward=" + backward)
    losses = launch(train_and_report, 2, config(make_config, f"sharding={sharding}", *q))[0]["losses"]
    _close_but_not_equal(losses, fp32, "fp16")


# --- compressed dense allreduce ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_compression_hook_gives_the_rounded_mean(precision):
    """Flat (torch's bf16/fp16_compress_hook): the optimizer sees exactly each rank's gradient rounded
    to the format, halved and summed there, cast back; not the fp32 mean."""
    results = launch(compressed_gradients, 2, precision, 1, 2)
    mean = torch.stack(results[0]["locals"]).mean(0)
    for r in results:
        assert r["hooked"] == 1
        torch.testing.assert_close(r["seen"], r["flat_expected"], rtol=0, atol=0)
        assert not torch.equal(r["seen"], mean)
        _within_rounding(r["seen"], r["locals"], U[precision], roundings=2)  # the cast, the sum


@pytest.mark.slow
def test_compression_composes_with_the_hierarchical_allreduce():
    """2 nodes x 2 ranks, bf16: the three steps ran in bf16 (every gradient is a bf16 value), and
    the result is the mean within bf16 rounding, the same on every rank."""
    results = launch(compressed_gradients, 2, "bf16", 2, 2, nnodes=2)
    mean = torch.stack(results[0]["locals"]).mean(0)
    for r in results:
        assert r["hooked"] == 1
        assert torch.equal(r["seen"], r["seen"].bfloat16().float())
        assert torch.equal(r["seen"], results[0]["seen"])
        assert not torch.equal(r["seen"], mean)
        _within_rounding(r["seen"], r["locals"], U["bf16"], roundings=3)  # the cast, the two sums


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_compressed_dense_allreduce_trains_close_to_fp32(make_config, precision):
    fp32 = launch(train_and_report, 2, config(make_config, "sharding=table_wise"))[0]["losses"]
    cfg = config(make_config, "sharding=table_wise", f"trainer.dense_allreduce_precision={precision}")
    _close_but_not_equal(launch(train_and_report, 2, cfg)[0]["losses"], fp32, precision)


# --- evaluation on rank 0 ----------------------------------------------------------------------------


@pytest.mark.slow
def test_rank0_scores_every_slice_and_every_rank_gets_the_result():
    g = np.random.default_rng(0)
    labels = (g.random(2 * 500) < 0.4).astype(np.float32)
    logits = (g.integers(0, 7, 2 * 500) + labels).astype(np.float32)  # many ties across the two slices
    both = torch.from_numpy(np.stack([logits, labels]))
    results = launch(score_slices, 2, [both[:, :500], both[:, 500:]])
    assert results[0] == results[1]
    assert results[0]["samples"] == 1000
    assert results[0]["auc"] == pytest.approx(numpy_auc(logits, labels), abs=1e-12)
    expected_logloss = torch.nn.functional.binary_cross_entropy_with_logits(both[0], both[1]).item()
    assert results[0]["logloss"] == pytest.approx(expected_logloss, rel=1e-6)
    one_class = torch.stack([torch.arange(8.0), torch.ones(8)])
    assert launch(score_slices, 2, [one_class[:, :4], one_class[:, 4:]])[1]["auc"] is None


@pytest.mark.slow
def test_two_ranks_evaluate_like_one_process(make_config):
    cfg = config(make_config, "sharding=table_wise", "data.eval_batches=4")
    one = launch(train_summary, 1, cfg)[0]
    two = launch(train_summary, 2, cfg)
    assert two[0]["eval_auc"] == two[1]["eval_auc"] == pytest.approx(one["eval_auc"], abs=1e-5)
    assert two[0]["eval_logloss"] == pytest.approx(one["eval_logloss"], rel=1e-5)
