"""A sharded multi-rank run equals the unsharded single-process run on the same global batches.

Each test reads runs of `train_and_report` on the 2 ranks of the PAIR family (tests/helpers/families.py).
"""

import pytest
import torch

from dlrm.config.compose import compose
from tests.helpers.equivalence import matches, reference, tiny
from tests.helpers.families import LONG_PAIR, PAIR, runs
from tests.helpers.workers import train_and_report

SHARDINGS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "mixed"]
FP32 = tiny("sharding=table_wise")  # the baseline several modules compare against
NO_PIPELINE = tiny("sharding=table_wise", "trainer.pipeline=false")
BF16_DENSE = tiny("sharding=table_wise", "trainer.dense_precision=bf16")
DP_OPTIMS = ("optim=rowwise_adagrad", "optim.dense.name=sgd", "optim.dense.lr=0.1", "optim.schedule.warmup_steps=6")
COMPILED = {
    "mlp": tiny("sharding=table_wise", "trainer.compile_dense=true"),
    "dcn": tiny(
        "sharding=table_wise",
        "trainer.compile_dense=true",
        "model.interaction=dcn",
        "model.dcn_num_layers=2",
        "model.dcn_low_rank_dim=4",
    ),
}
CPU_GEMMS = {gemm: tiny("sharding=table_wise", f"trainer.cpu_gemm={gemm}") for gemm in ("mkl", "onednn")}
# Two tasks, and t_C4 (3 ids per sample) mean-pooled and column-wise sharded: each rank pools its columns.
TASKS_MEAN = tiny(
    "sharding=table_wise",
    "model.tasks=[{name:click,weight:1.0},{name:like,weight:0.5}]",
    "model.top_mlp=[16,2]",
    "model.tables.3.pooling_type=mean",
    "model.tables.3.sharding=column_wise",
)
DCN_DIMS = tiny(  # t_C2 of dim 4 among dim-8 tables: the cross net over the concatenation
    "sharding=table_wise",
    "model.interaction=dcn",
    "model.dcn_num_layers=2",
    "model.dcn_low_rank_dim=4",
    "model.tables.1.dim=4",
)

# No dense features (Avazu-like data): no bottom MLP, the interaction over the embeddings alone.
NO_DENSE = {
    "dot": tiny("sharding=row_wise", "model.dense_in_features=0", "model.bottom_mlp=[]"),
    "dcn": tiny(
        "sharding=column_wise",
        "model.dense_in_features=0",
        "model.bottom_mlp=[]",
        "model.interaction=dcn",
        "model.dcn_num_layers=2",
        "model.dcn_low_rank_dim=4",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("sharding", SHARDINGS)
@runs(results=lambda sharding: PAIR.job(train_and_report, tiny(f"sharding={sharding}")))
def test_two_ranks_equal_one_process(sharding, results):
    overrides = tiny(f"sharding={sharding}")
    ref_losses, _ = reference(overrides)
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    cfg = compose(list(overrides))
    planned = {row["table"]: row["sharding_type"] for row in results[0]["plan"]}
    expected = {t.name: cfg.sharding.per_table.get(t.name, cfg.sharding.strategy) for t in cfg.model.tables}
    assert planned == expected
    matches(results, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("gemm", sorted(CPU_GEMMS))
@runs(results=lambda gemm: PAIR.job(train_and_report, CPU_GEMMS[gemm]))
def test_either_cpu_gemm_trains_as_the_reference(gemm, results):
    """trainer.cpu_gemm: the MLPs' fp32 products in MKL or in oneDNN train as the unsharded reference
    (torch's products: MKL) does, within fp32 tolerance."""
    assert all(r["onednn"] == [gemm == "onednn"] * 2 for r in results)  # the bottom and top MLPs
    matches(results, CPU_GEMMS[gemm])


@pytest.mark.slow
@pytest.mark.parametrize("interaction", sorted(NO_DENSE))
@runs(results=lambda interaction: PAIR.job(train_and_report, NO_DENSE[interaction]))
def test_a_model_without_dense_features_equals_one_process(interaction, results):
    ref_losses, _ = reference(NO_DENSE[interaction])
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    matches(results, NO_DENSE[interaction])


@pytest.mark.slow
@runs(results=PAIR.job(train_and_report, TASKS_MEAN))
def test_two_tasks_and_a_mean_pooled_sharded_table_equal_one_process(results):
    assert {row["table"]: row["sharding_type"] for row in results[0]["plan"]}["t_C4"] == "column_wise"
    matches(results, TASKS_MEAN)
    summary = results[0]["summary"]
    for task in ("click", "like"):
        assert 0.0 < summary[f"eval_auc/{task}"] < 1.0 and summary[f"eval_ne/{task}"] > 0.0
        assert summary[f"eval_calibration/{task}"] > 0.0 and summary[f"eval_logloss/{task}"] > 0.0
    assert summary["eval_auc"] == summary["eval_auc/click"]  # the first task's, as trainer.target_auc reads


@pytest.mark.slow
@runs(results=PAIR.job(train_and_report, DCN_DIMS))
def test_dcn_over_tables_of_different_dims_equals_one_process(results):
    ref_losses, _ = reference(DCN_DIMS)
    assert ref_losses[-1] < ref_losses[0]
    matches(results, DCN_DIMS)


@pytest.mark.slow
@runs(other_seed=PAIR.job(train_and_report, tiny("sharding=table_wise", "seed=1")))
def test_a_different_start_is_detected(other_seed):
    """The comparison has teeth: another seed on the ranks must not match the reference."""
    with pytest.raises(AssertionError):
        matches(other_seed, FP32)


@pytest.mark.slow
@runs(results=PAIR.job(train_and_report, NO_PIPELINE))
def test_non_pipelined_two_ranks_equal_one_process(results):
    matches(results, NO_PIPELINE)


@pytest.mark.slow
@runs(fp32=PAIR.job(train_and_report, FP32), bf16=PAIR.job(train_and_report, BF16_DENSE))
def test_bf16_dense_precision_trains_close_to_fp32(fp32, bf16):
    fp32, bf16 = fp32[0]["losses"], bf16[0]["losses"]
    assert bf16 != fp32, "autocast must change the arithmetic"
    assert bf16 == pytest.approx(fp32, rel=2e-2)


@pytest.mark.slow
@runs(
    fused=PAIR.job(train_and_report, tiny("sharding=table_wise", *DP_OPTIMS)),
    replicated=PAIR.job(train_and_report, tiny("sharding=data_parallel", *DP_OPTIMS)),
)
def test_data_parallel_tables_get_the_embedding_optimizer_and_schedule(fused, replicated):
    """Data-parallel tables (replicated, outside the fused kernels) train like table-wise ones
    (fbgemm's fused row-wise Adagrad): same optimizer, lr and warmup, not the dense optimizer's."""
    assert replicated[0]["losses"] == pytest.approx(fused[0]["losses"], rel=1e-5, abs=1e-6)

    def whole(results):  # each table is whole on one rank (table-wise) or on every rank (replicated)
        return {name: piece for r in results for name, pieces in r["pieces"].items() for _, piece in pieces}

    a, b = whole(fused), whole(replicated)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("interaction", sorted(COMPILED))
@runs(results=lambda interaction: LONG_PAIR.job(train_and_report, COMPILED[interaction]))  # Inductor: ~30-60 s a rank
def test_compiled_dense_arch_trains_as_the_eager_reference(interaction, results):
    """trainer.compile_dense (Inductor) computes the MLPs and the interaction as eager PyTorch does;
    tests/models/test_dlrm.py checks compile in-process."""
    matches(results, COMPILED[interaction])
