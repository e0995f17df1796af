"""Training on preprocessed real Criteo rows: 2 sharded ranks equal the unsharded model."""

import pytest
import torch

from dlrm.config import Config
from dlrm.config.compose import compose
from dlrm.data.criteo.format import NUM_SPARSE, ParseOptions
from dlrm.data.criteo.preprocess import preprocess
from dlrm.distributed.world import World
from tests.helpers.criteo import SAMPLE, needs_sample
from tests.helpers.equivalence import assert_matches_reference
from tests.helpers.families import PAIR, Overrides, runs
from tests.helpers.harness import default_group
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import train_and_report

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


def preprocess_then_train(cfg: Config, tsv: str, table_rows: int) -> dict:
    """On each rank: rank 0 preprocesses `tsv` into cfg.data.criteo.dir (ids modulo `table_rows`), as
    `python -m dlrm.data.criteo.preprocess --table-sizes N` does; then every rank: train_and_report."""
    if World.from_env().rank == 0:
        assert cfg.data.criteo.dir is not None
        preprocess([tsv], cfg.data.criteo.dir, ParseOptions("fail", "modulo", (table_rows,) * NUM_SPARSE))
    torch.distributed.barrier(group=default_group())
    return train_and_report(cfg)


@pytest.mark.slow
@runs(results=PAIR.job(preprocess_then_train, CRITEO, str(SAMPLE), 2000))  # not declared when skipped (no sample)
def test_training_on_preprocessed_sample(results):
    # rank 0 preprocessed the sample into data.criteo.dir, then both trained
    ref_losses, ref_weights = train_unsharded(compose(list(CRITEO)))
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0
