"""A sharded multi-rank run equals the unsharded single-process run on the same global batches."""

import pytest
import torch

from tests.helpers.equivalence import assert_matches_reference, config
from tests.helpers.harness import launch
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import train_and_report


@pytest.mark.slow
@pytest.mark.parametrize(
    "sharding", ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "mixed"]
)
def test_two_ranks_equal_one_process(make_config, sharding):
    cfg = config(make_config, f"sharding={sharding}")
    ref_losses, ref_weights = train_unsharded(cfg)
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    results = launch(train_and_report, 2, cfg)
    planned = {row["table"]: row["sharding_type"] for row in results[0]["plan"]}
    expected = {t.name: cfg.sharding.per_table.get(t.name, cfg.sharding.strategy) for t in cfg.model.tables}
    assert planned == expected
    assert_matches_reference(results, ref_losses, ref_weights)


@pytest.mark.slow
def test_a_different_start_is_detected(make_config):
    """The comparison has teeth: another seed on the ranks must not match the reference."""
    ref_losses, ref_weights = train_unsharded(config(make_config, "sharding=table_wise"))
    results = launch(train_and_report, 2, config(make_config, "sharding=table_wise", "seed=1"))
    with pytest.raises(AssertionError):
        assert_matches_reference(results, ref_losses, ref_weights)


@pytest.mark.slow
def test_non_pipelined_two_ranks_equal_one_process(make_config):
    cfg = config(make_config, "sharding=table_wise", "trainer.pipeline=false")
    ref_losses, ref_weights = train_unsharded(cfg)
    assert_matches_reference(launch(train_and_report, 2, cfg), ref_losses, ref_weights)


@pytest.mark.slow
def test_bf16_dense_precision_trains_close_to_fp32(make_config):
    fp32 = launch(train_and_report, 2, config(make_config, "sharding=table_wise"))[0]["losses"]
    bf16 = launch(train_and_report, 2, config(make_config, "sharding=table_wise", "trainer.dense_precision=bf16"))[0][
        "losses"
    ]
    assert bf16 != fp32, "autocast must change the arithmetic"
    assert bf16 == pytest.approx(fp32, rel=2e-2)


@pytest.mark.slow
def test_data_parallel_tables_get_the_embedding_optimizer_and_schedule(make_config):
    """Data-parallel tables (replicated, outside the fused kernels) train like table-wise ones
    (fbgemm's fused row-wise Adagrad): same optimizer, lr and warmup, not the dense optimizer's."""
    opts = ("optim=rowwise_adagrad", "optim.dense.name=sgd", "optim.dense.lr=0.1", "optim.schedule.warmup_steps=6")
    fused = launch(train_and_report, 2, config(make_config, "sharding=table_wise", *opts))
    replicated = launch(train_and_report, 2, config(make_config, "sharding=data_parallel", *opts))
    assert replicated[0]["losses"] == pytest.approx(fused[0]["losses"], rel=1e-5, abs=1e-6)

    def whole(results):  # each table is whole on one rank (table-wise) or on every rank (replicated)
        return {name: piece for r in results for name, pieces in r["pieces"].items() for _, piece in pieces}

    a, b = whole(fused), whole(replicated)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "interaction", [[], ["model.interaction=dcn", "model.dcn_num_layers=2", "model.dcn_low_rank_dim=4"]]
)
def test_compiled_dense_arch_trains_as_the_eager_reference(make_config, interaction):
    """trainer.compile_dense (Inductor) computes the MLPs and the interaction as eager PyTorch does."""
    cfg = config(make_config, "sharding=table_wise", "trainer.compile_dense=true", *interaction)
    ref_losses, ref_weights = train_unsharded(cfg)
    assert_matches_reference(launch(train_and_report, 2, cfg), ref_losses, ref_weights)
