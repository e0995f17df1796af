"""Training on preprocessed real Criteo rows: 2 sharded ranks equal the unsharded model."""

import pytest

from dlrm.config.compose import compose
from tests.helpers.criteo import SAMPLE, needs_sample
from tests.helpers.equivalence import assert_matches_reference
from tests.helpers.families import PAIR, Overrides, runs
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import preprocess_then_train

pytestmark = needs_sample

CRITEO = Overrides(
    "data=criteo_kaggle",
    f"data.criteo.dir={PAIR.dir('criteo_sample')}",
    "data.criteo.eval_fraction=0.2",
    "data.global_batch_size=16",
    "data.eval_batches=1",
    "optim=sgd",
    "trainer.max_steps=8",
    "trainer.log_every_steps=1",
    "trainer.progress=none",
    "sharding=row_wise",
)


@pytest.mark.slow
@runs(results=PAIR.job(preprocess_then_train, CRITEO, str(SAMPLE), 2000))  # not declared when skipped (no sample)
def test_training_on_preprocessed_sample(results):
    # rank 0 preprocessed the sample into data.criteo.dir, then both trained
    ref_losses, ref_weights = train_unsharded(compose(list(CRITEO)))
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0
