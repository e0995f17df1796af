"""Training on Parquet data with jagged (variable-length), hashed-string and one-id features, unweighted
and weighted (per-id weights and sample weights): 2 sharded ranks equal the unsharded model on the same
global batches."""

import pytest
import torch

from dlrm.config import Config
from dlrm.config.compose import compose
from dlrm.distributed.world import World
from tests.helpers.equivalence import assert_matches_reference, tiny
from tests.helpers.families import PAIR, runs
from tests.helpers.harness import default_group
from tests.helpers.parquet_data import overrides, write_dataset
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import train_and_report


def write_parquet_then_train(cfg: Config) -> dict:
    """On each rank: rank 0 writes the dataset of tests/helpers/parquet_data.py into
    cfg.data.parquet.path; then every rank: train_and_report."""
    if World.from_env().rank == 0:
        assert cfg.data.parquet.path is not None
        write_dataset(cfg.data.parquet.path)
    torch.distributed.barrier(group=default_group())
    return train_and_report(cfg)


PARQUET = tiny("sharding=row_wise", *overrides(PAIR.dir("parquet_data")))
# per-id weights on the jagged feature (model.weighted) and sample weights (data.parquet.weight: 0 to 3,
# so the ranks' slices weigh differently): table-wise, and each table's kernel as planned
WEIGHTED = tiny(
    "sharding=table_wise",
    *overrides(PAIR.dir("parquet_weighted")),
    "model.weighted=true",
    "data.parquet.sparse=[{name:user,kind:id},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]",
    "data.parquet.weight=w",
)


@pytest.mark.slow
@runs(results=PAIR.job(write_parquet_then_train, PARQUET))  # rank 0 writes the files, then both train
def test_two_ranks_on_parquet_equal_one_process(results):
    ref_losses, ref_weights = train_unsharded(compose(list(PARQUET)))
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0


@pytest.mark.slow
@runs(results=PAIR.job(write_parquet_then_train, WEIGHTED))
def test_two_ranks_on_weighted_parquet_features_equal_one_process(results):
    ref_losses, ref_weights = train_unsharded(compose(list(WEIGHTED)))
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    assert_matches_reference(results, ref_losses, ref_weights)
    _, plain = train_unsharded(compose([*WEIGHTED, "model.weighted=false", *overrides(PAIR.dir("parquet_weighted"))]))
    items = next(k for k in plain if "t_items" in k)
    change = (plain[items] - ref_weights[items]).abs().max().item()
    # 100x the equivalence's atol: a side that ignored the weights could not pass the comparison above
    assert change > 2e-4, f"the weights must change the trained table ({change})"
    _, unweighted = train_unsharded(compose([*WEIGHTED, "data.parquet.weight=null"]))
    change = max((unweighted[k] - ref_weights[k]).abs().max().item() for k in ref_weights)
    assert change > 2e-4, f"the sample weights must change the trained model ({change})"
    assert results[0]["summary"]["eval_logloss"] > 0
