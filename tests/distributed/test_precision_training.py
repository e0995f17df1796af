"""The GPU-run options on 2 (or 2 x 2) Gloo ranks: fp16 tables, quantized embedding comms,
compressed dense allreduce, and evaluation scored on rank 0.

Tolerances come from the formats' unit roundoff u (fp16 2^-11 ~ 4.9e-4, bf16 2^-8 ~ 3.9e-3): one
rounding moves a value by at most u relative; over the 8 steps of these runs the losses stay within
a few u of the fp32 run (the bounds below are 4 u), and must still differ from it: the option ran.
The runs are jobs of the 2-rank, 2 x 2 and 1-rank families (tests/helpers/families.py); the
fp32 baselines are the same jobs as test_equivalence's, run once.
"""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrm.config.compose import compose
from dlrm.data.source import make_source
from dlrm.distributed.dense_sync import use_compressed_allreduce, use_hierarchical_allreduce
from dlrm.distributed.topology import build_process_groups
from dlrm.export import export, load_exported
from dlrm.trainer.metrics import score_on_rank0
from tests.helpers.equivalence import STEPS, tiny
from tests.helpers.families import PAIR, SINGLE, TWO_NODES, runs
from tests.helpers.harness import default_group
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


def fp32_run(sharding="table_wise"):
    """The fp32 baseline (test_equivalence's run)."""
    return PAIR.job(train_and_report, tiny(f"sharding={sharding}"))


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "row_wise"])
@runs(
    fp32=fp32_run,
    fp16=lambda sharding: PAIR.job(train_and_report, tiny(f"sharding={sharding}", "model.embedding_precision=fp16")),
)
def test_fp16_tables_train_close_to_fp32(sharding, fp32, fp16):
    _close_but_not_equal(fp16[0]["losses"], fp32[0]["losses"], "fp16")
    for rank in range(2):
        for name, pieces in fp16[rank]["pieces"].items():
            reference = dict(fp32[rank]["pieces"][name])
            for offsets, piece in pieces:
                assert piece.dtype == (torch.float16 if TABLES in name else torch.float32), name
                if TABLES in name:  # the initial rounding, then up to 1 ulp (2 u |w|) per stochastically rounded update
                    ulp = 2 * U["fp16"] * reference[offsets].abs().max().item()
                    torch.testing.assert_close(piece.float(), reference[offsets], rtol=0, atol=(STEPS + 1) * ulp)


FP16_AT_4 = PAIR.dir("fp16_whole") / "step_00000004"


@pytest.mark.slow
@runs(
    whole=PAIR.job(train_and_report, _fp16_resume("fp16_whole")),
    resumed=PAIR.job(train_and_report, _fp16_resume("fp16_again", f"trainer.resume={FP16_AT_4}")),
)
def test_fp16_tables_resume_and_export(tmp_path, whole, resumed):
    """Row-wise Adagrad (fp32 state in fbgemm) with fp16 weights: a resume continues exactly, and the
    export holds the fp16 tables, which the rebuilt unsharded model runs."""
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


FP32_AT_4 = PAIR.dir("into_fp32") / "step_00000004"


@pytest.mark.slow
@runs(
    whole=PAIR.job(train_and_report, _into_fp16("into_fp32")),
    resumed=PAIR.job(
        train_and_report, _into_fp16("into_fp16", "model.embedding_precision=fp16", f"trainer.resume={FP32_AT_4}")
    ),
)
def test_an_fp32_checkpoint_resumes_into_fp16_tables(whole, resumed):
    """The precision may change at a resume: DCP casts the saved fp32 tables into the fp16 ones."""
    _close_but_not_equal(resumed[0]["losses"], whole[0]["losses"][4:], "fp16")
    tables = [piece for name, pieces in resumed[0]["pieces"].items() if TABLES in name for _, piece in pieces]
    assert tables and all(t.dtype == torch.float16 for t in tables)


# --- quantized embedding comms -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sharding, forward, backward", QCOMMS)
@runs(
    fp32=fp32_run,
    quantized=lambda sharding, forward, backward: PAIR.job(
        train_and_report,
        tiny(f"sharding={sharding}", f"sharding.qcomms_forward={forward}", f"sharding.qcomms_backward={backward}"),
    ),
)
def test_quantized_embedding_comms_train_close_to_fp32(sharding, forward, backward, fp32, quantized):
    _close_but_not_equal(quantized[0]["losses"], fp32[0]["losses"], "fp16")


# --- compressed dense allreduce ------------------------------------------------------------------------


DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _net(rank: int) -> torch.nn.Module:
    """Two layers whose gradients (with the rank's input) are not representable in bf16/fp16."""
    torch.manual_seed(0)  # the same weights on every rank, as DDP requires
    return torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.Tanh(), torch.nn.Linear(53, 3))


def _input(rank: int) -> torch.Tensor:
    return torch.randn(16, 37, generator=torch.Generator().manual_seed(100 + rank))


def compressed_gradients(precision: str, nodes: int, ranks_per_node: int) -> dict:
    """On each rank: DDP with our compression hook (flat for nodes == 1, hierarchical otherwise) on a small net.

    Returns the gradients the optimizer would see, every rank's local (uncommunicated) fp32
    gradients, and what the flat hook must give: each rank's gradient rounded to `precision`,
    divided by the world size there, summed there (gloo, 2 ranks: one rounding) and cast back.
    """
    default_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(_net(rank), bucket_cap_mb=1)
    if nodes == 1:
        hooked = use_compressed_allreduce(ddp, precision, dist.group.WORLD)
    else:
        hooked = use_hierarchical_allreduce(
            ddp, build_process_groups(torch.device("cpu"), nodes, ranks_per_node), precision
        )
    with ddp.no_sync():  # the local gradients, no communication
        ddp(_input(rank)).square().sum().backward()
    local = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone()
    ddp.zero_grad()
    ddp(_input(rank)).square().sum().backward()
    seen = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone()
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    dtype = DTYPES[precision]
    summed = torch.zeros_like(local, dtype=dtype)
    for g in every:
        summed = summed + g.to(dtype).div(world)  # each add rounds to `dtype`
    return {"hooked": hooked, "seen": seen, "locals": every, "flat_expected": summed.float()}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@runs(results=lambda precision: PAIR.job(compressed_gradients, precision, 1, 2))
def test_compression_hook_gives_the_rounded_mean(precision, results):
    """Flat (torch's bf16/fp16_compress_hook): the optimizer sees exactly each rank's gradient rounded
    to the format, halved and summed there, cast back; not the fp32 mean."""
    mean = torch.stack(results[0]["locals"]).mean(0)
    for r in results:
        assert r["hooked"] == 1
        torch.testing.assert_close(r["seen"], r["flat_expected"], rtol=0, atol=0)
        assert not torch.equal(r["seen"], mean)
        _within_rounding(r["seen"], r["locals"], U[precision], roundings=2)  # the cast, the sum


@pytest.mark.slow
@runs(results=TWO_NODES.job(compressed_gradients, "bf16", 2, 2))
def test_compression_composes_with_the_hierarchical_allreduce(results):
    """2 nodes x 2 ranks, bf16: the three steps ran in bf16 (every gradient is a bf16 value), and
    the result is the mean within bf16 rounding, the same on every rank."""
    mean = torch.stack(results[0]["locals"]).mean(0)
    for r in results:
        assert r["hooked"] == 1
        assert torch.equal(r["seen"], r["seen"].bfloat16().float())
        assert torch.equal(r["seen"], results[0]["seen"])
        assert not torch.equal(r["seen"], mean)
        _within_rounding(r["seen"], r["locals"], U["bf16"], roundings=3)  # the cast, the two sums


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@runs(
    fp32=fp32_run(),
    compressed=lambda precision: PAIR.job(
        train_and_report, tiny("sharding=table_wise", f"trainer.dense_allreduce_precision={precision}")
    ),
)
def test_compressed_dense_allreduce_trains_close_to_fp32(precision, fp32, compressed):
    _close_but_not_equal(compressed[0]["losses"], fp32[0]["losses"], precision)


# --- evaluation on rank 0 ----------------------------------------------------------------------------


def score_slices(slices: list[torch.Tensor]) -> dict:
    """On each rank: `score_on_rank0` of this rank's [2, N] slice of `slices`."""
    default_group()
    result = score_on_rank0(slices[dist.get_rank()], dist.group.WORLD)
    return result


_G = np.random.default_rng(0)
LABELS = (_G.random(2 * 500) < 0.4).astype(np.float32)
LOGITS = (_G.integers(0, 7, 2 * 500) + LABELS).astype(np.float32)  # many ties across the two slices
_BOTH = torch.from_numpy(np.stack([LOGITS, LABELS]))
_ONE_CLASS = torch.stack([torch.arange(8.0), torch.ones(8)])


@pytest.mark.slow
@runs(
    results=PAIR.job(score_slices, [_BOTH[:, :500], _BOTH[:, 500:]]),
    one_class=PAIR.job(score_slices, [_ONE_CLASS[:, :4], _ONE_CLASS[:, 4:]]),
)
def test_rank0_scores_every_slice_and_every_rank_gets_the_result(results, one_class):
    assert results[0] == results[1]
    assert results[0]["samples"] == 1000
    assert results[0]["auc"] == pytest.approx(numpy_auc(LOGITS, LABELS), abs=1e-12)
    expected_logloss = torch.nn.functional.binary_cross_entropy_with_logits(_BOTH[0], _BOTH[1]).item()
    assert results[0]["logloss"] == pytest.approx(expected_logloss, rel=1e-6)
    assert one_class[1]["auc"] is None


EVAL4 = tiny("sharding=table_wise", "data.eval_batches=4")


@pytest.mark.slow
@runs(one=SINGLE.job(train_summary, EVAL4), two=PAIR.job(train_summary, EVAL4))
def test_two_ranks_evaluate_like_one_process(one, two):
    (one,) = one
    assert two[0]["eval_auc"] == two[1]["eval_auc"] == pytest.approx(one["eval_auc"], abs=1e-5)
    assert two[0]["eval_logloss"] == pytest.approx(one["eval_logloss"], rel=1e-5)
