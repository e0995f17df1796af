"""Training on preprocessed real Criteo rows: 2 sharded ranks equal the unsharded model."""

import subprocess
import sys

import pytest

from tests.helpers.criteo import SAMPLE, needs_sample
from tests.helpers.equivalence import assert_matches_reference
from tests.helpers.harness import launch
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import train_and_report

pytestmark = needs_sample


@pytest.mark.slow
def test_training_on_preprocessed_sample(make_config, tmp_path):
    subprocess.run(
        [sys.executable, "-m", "dlrm.data.preprocess", "--out", str(tmp_path), "--table-sizes", "2000", str(SAMPLE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cfg = make_config(
        "data=criteo_kaggle",
        f"data.criteo.dir={tmp_path}",
        "data.criteo.eval_fraction=0.2",
        "data.global_batch_size=16",
        "data.eval_batches=1",
        "optim=sgd",
        "trainer.max_steps=8",
        "trainer.log_every_steps=1",
        "trainer.progress=none",
        "sharding=row_wise",
    )
    ref_losses, ref_weights = train_unsharded(cfg)
    results = launch(train_and_report, 2, cfg)
    assert_matches_reference(results, ref_losses, ref_weights)
    summary = results[0]["summary"]
    assert summary["steps"] == 8 and summary["eval_logloss"] > 0
