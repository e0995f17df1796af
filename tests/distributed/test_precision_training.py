"""The GPU-run options on 2 (or 2 x 2) Gloo ranks: fp16 tables, quantized embedding comms,
compressed dense allreduce, and evaluation scored on rank 0.

Tolerances come from the formats' unit roundoff u (fp16 2^-11 ~ 4.9e-4, bf16 2^-8 ~ 3.9e-3): one
rounding moves a value by at most u relative; over the 8 steps of these runs the losses stay within
a few u of the fp32 run (the bounds below are 4 u), and must still differ from it: the option ran.
The runs are jobs of the 2-rank, 2 x 2 and 1-rank families (tests/helpers/families.py).
"""

import numpy as np
import pytest
import torch

from dlrm.config.compose import compose
from dlrm.data.source import make_source
from dlrm.export import export, load_exported
from tests.helpers.equivalence import STEPS, tiny
from tests.helpers.families import PAIR, SINGLE, TWO_NODES
from tests.helpers.precision_workers import compressed_gradients, score_slices
from tests.helpers.scoring import numpy_auc
from tests.helpers.workers import train_and_report, train_summary

U = {"fp16": 2.0**-11, "bf16": 2.0**-8}
TABLES = "embedding_bags"
QCOMMS = [
    ("table_wise", "fp16", "fp32"),  # alltoall of the pooled embeddings
    ("table_wise", "fp32", "fp16"),  # alltoall of their gradients
    ("table_wise", "fp16", "fp16"),
    ("row_wise", "fp16", "fp16"),  # reduce-scatter forward, allgather of the gradients backward
]


def _fp16_resume(name, *overrides):
    """Row-wise Adagrad with fp16 tables, checkpoints every 4 steps, in the family's directory `name`."""
    return tiny(
        "sharding=table_wise",
        "model.embedding_precision=fp16",
        "optim=rowwise_adagrad",
        "trainer.max_steps=8",
        "checkpoint.every_steps=4",
        "checkpoint.keep=3",
        f"checkpoint.dir={PAIR.dir(name)}",
        *overrides,
    )


def _into_fp16(name, *overrides):
    return tiny(
        "sharding=table_wise",
        "optim=rowwise_adagrad",
        "checkpoint.every_steps=4",
        f"checkpoint.dir={PAIR.dir(name)}",
        *overrides,
    )


# The fp32 baselines (shared with test_equivalence: the same jobs).
FP32 = {s: PAIR.add(f"fp32/{s}", train_and_report, tiny(f"sharding={s}")) for s in ("table_wise", "row_wise")}
FP16_TABLES = {
    s: PAIR.add(f"fp16_tables/{s}", train_and_report, tiny(f"sharding={s}", "model.embedding_precision=fp16"))
    for s in ("table_wise", "row_wise")
}
FP16_WHOLE = PAIR.add("fp16_resume/whole", train_and_report, _fp16_resume("fp16_whole"))
_AT_4 = PAIR.dir("fp16_whole") / "step_00000004"
FP16_RESUMED = PAIR.add("fp16_resume/again", train_and_report, _fp16_resume("fp16_again", f"trainer.resume={_AT_4}"))
INTO_FP32 = PAIR.add("into_fp16/fp32", train_and_report, _into_fp16("into_fp32"))
_INTO_AT_4 = PAIR.dir("into_fp32") / "step_00000004"
INTO_FP16 = PAIR.add(
    "into_fp16/fp16",
    train_and_report,
    _into_fp16("into_fp16", "model.embedding_precision=fp16", f"trainer.resume={_INTO_AT_4}"),
)
QCOMMS_RUNS = {
    (s, f, b): PAIR.add(
        f"qcomms/{s}/{f}/{b}",
        train_and_report,
        tiny(f"sharding={s}", f"sharding.qcomms_forward={f}", f"sharding.qcomms_backward={b}"),
    )
    for s, f, b in QCOMMS
}
HOOK = {p: PAIR.add(f"hook/{p}", compressed_gradients, p, 1, 2) for p in ("bf16", "fp16")}
COMPRESSED_DENSE = {
    p: PAIR.add(
        f"compressed_dense/{p}", train_and_report, tiny("sharding=table_wise", f"trainer.dense_allreduce_precision={p}")
    )
    for p in ("bf16", "fp16")
}
HOOK_HIERARCHICAL = TWO_NODES.add("hook/bf16/hierarchical", compressed_gradients, "bf16", 2, 2)

_G = np.random.default_rng(0)
LABELS = (_G.random(2 * 500) < 0.4).astype(np.float32)
LOGITS = (_G.integers(0, 7, 2 * 500) + LABELS).astype(np.float32)  # many ties across the two slices
_BOTH = torch.from_numpy(np.stack([LOGITS, LABELS]))
_ONE_CLASS = torch.stack([torch.arange(8.0), torch.ones(8)])
SCORE_SLICES = PAIR.add("score/slices", score_slices, [_BOTH[:, :500], _BOTH[:, 500:]])
SCORE_ONE_CLASS = PAIR.add("score/one_class", score_slices, [_ONE_CLASS[:, :4], _ONE_CLASS[:, 4:]])
EVAL4 = tiny("sharding=table_wise", "data.eval_batches=4")
EVAL4_TWO_RANKS = PAIR.add("eval4", train_summary, EVAL4)
EVAL4_ONE_RANK = SINGLE.add("eval4", train_summary, EVAL4)


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
def test_fp16_tables_train_close_to_fp32(sharding):
    fp32 = FP32[sharding].results()
    fp16 = FP16_TABLES[sharding].results()
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
def test_fp16_tables_resume_and_export(tmp_path):
    """Row-wise Adagrad (fp32 state in fbgemm) with fp16 weights: a resume continues exactly, and the
    export holds the fp16 tables, which the rebuilt unsharded model runs."""
    whole, resumed = FP16_WHOLE.results(), FP16_RESUMED.results()
    assert resumed[0]["losses"] == whole[0]["losses"][4:]
    exported = export(PAIR.dir("fp16_again") / "step_00000008", tmp_path / "model.pt")
    for result in resumed:
        for name, pieces in result["pieces"].items():
            for (r0, c0), piece in pieces:
                full = exported[name]
                expected = full[r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]] if full.dim() == 2 else full
                assert expected.dtype == piece.dtype and torch.equal(piece, expected), name
    model = load_exported(tmp_path / "model.pt")
    batch = make_source(compose(list(_fp16_resume("x")))).samples("eval", 0, 16)
    loss, _ = model(batch)
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_an_fp32_checkpoint_resumes_into_fp16_tables():
    """The precision may change at a resume: DCP casts the saved fp32 tables into the fp16 ones."""
    whole, resumed = INTO_FP32.results(), INTO_FP16.results()
    _close_but_not_equal(resumed[0]["losses"], whole[0]["losses"][4:], "fp16")
    tables = [piece for name, pieces in resumed[0]["pieces"].items() if TABLES in name for _, piece in pieces]
    assert tables and all(t.dtype == torch.float16 for t in tables)


# --- quantized embedding comms -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sharding, forward, backward", QCOMMS)
def test_quantized_embedding_comms_train_close_to_fp32(sharding, forward, backward):
    fp32 = FP32[sharding].results()[0]["losses"]
    _close_but_not_equal(QCOMMS_RUNS[sharding, forward, backward].results()[0]["losses"], fp32, "fp16")


# --- compressed dense allreduce ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_compression_hook_gives_the_rounded_mean(precision):
    """Flat (torch's bf16/fp16_compress_hook): the optimizer sees exactly each rank's gradient rounded
    to the format, halved and summed there, cast back; not the fp32 mean."""
    results = HOOK[precision].results()
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
    results = HOOK_HIERARCHICAL.results()
    mean = torch.stack(results[0]["locals"]).mean(0)
    for r in results:
        assert r["hooked"] == 1
        assert torch.equal(r["seen"], r["seen"].bfloat16().float())
        assert torch.equal(r["seen"], results[0]["seen"])
        assert not torch.equal(r["seen"], mean)
        _within_rounding(r["seen"], r["locals"], U["bf16"], roundings=3)  # the cast, the two sums


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_compressed_dense_allreduce_trains_close_to_fp32(precision):
    fp32 = FP32["table_wise"].results()[0]["losses"]
    _close_but_not_equal(COMPRESSED_DENSE[precision].results()[0]["losses"], fp32, precision)


# --- evaluation on rank 0 ----------------------------------------------------------------------------


@pytest.mark.slow
def test_rank0_scores_every_slice_and_every_rank_gets_the_result():
    results = SCORE_SLICES.results()
    assert results[0] == results[1]
    assert results[0]["samples"] == 1000
    assert results[0]["auc"] == pytest.approx(numpy_auc(LOGITS, LABELS), abs=1e-12)
    expected_logloss = torch.nn.functional.binary_cross_entropy_with_logits(_BOTH[0], _BOTH[1]).item()
    assert results[0]["logloss"] == pytest.approx(expected_logloss, rel=1e-6)
    assert SCORE_ONE_CLASS.results()[1]["auc"] is None


@pytest.mark.slow
def test_two_ranks_evaluate_like_one_process():
    (one,), two = EVAL4_ONE_RANK.results(), EVAL4_TWO_RANKS.results()
    assert two[0]["eval_auc"] == two[1]["eval_auc"] == pytest.approx(one["eval_auc"], abs=1e-5)
    assert two[0]["eval_logloss"] == pytest.approx(one["eval_logloss"], rel=1e-5)
