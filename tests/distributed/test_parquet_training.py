"""Training on Parquet data with jagged (variable-length), hashed-string and one-id features: 2 sharded
ranks equal the unsharded model on the same global batches."""

import pytest

from dlrm.config.compose import compose
from tests.helpers.equivalence import assert_matches_reference, tiny
from tests.helpers.families import PAIR
from tests.helpers.parquet_data import overrides
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import write_parquet_then_train

PARQUET = tiny("sharding=row_wise", *overrides(PAIR.dir("parquet_data")))
PAIR.add("parquet/row_wise", write_parquet_then_train, PARQUET)


@pytest.mark.slow
def test_two_ranks_on_parquet_equal_one_process():
    results = PAIR["parquet/row_wise"]  # rank 0 wrote the files, then both trained
    ref_losses, ref_weights = train_unsharded(compose(list(PARQUET)))
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0
