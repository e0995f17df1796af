"""Training on Parquet data with jagged (variable-length), hashed-string and one-id features, unweighted
and weighted (per-id weights and sample weights): 2 sharded ranks equal the unsharded model on the same
global batches."""

import pytest

from dlrm.config.compose import compose
from tests.helpers.equivalence import assert_matches_reference, tiny
from tests.helpers.families import PAIR
from tests.helpers.parquet_data import overrides
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import write_parquet_then_train

PARQUET = tiny("sharding=row_wise", *overrides(PAIR.dir("parquet_data")))
ROW_WISE_RUN = PAIR.add("parquet/row_wise", write_parquet_then_train, PARQUET)
# per-id weights on the jagged feature (model.weighted) and sample weights (data.parquet.weight: 0 to 3,
# so the ranks' slices weigh differently): table-wise, and each table's kernel as planned
WEIGHTED = tiny(
    "sharding=table_wise",
    *overrides(PAIR.dir("parquet_weighted")),
    "model.weighted=true",
    "data.parquet.sparse=[{name:user,kind:id},{name:items,kind:ids,weights:items_w},{name:city,kind:string}]",
    "data.parquet.weight=w",
)
WEIGHTED_RUN = PAIR.add("parquet/weighted", write_parquet_then_train, WEIGHTED)


@pytest.mark.slow
def test_two_ranks_on_parquet_equal_one_process():
    results = ROW_WISE_RUN.results()  # rank 0 wrote the files, then both trained
    ref_losses, ref_weights = train_unsharded(compose(list(PARQUET)))
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0


@pytest.mark.slow
def test_two_ranks_on_weighted_parquet_features_equal_one_process():
    results = WEIGHTED_RUN.results()
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
