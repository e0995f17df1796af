"""The evaluator's part of the loop: the batches fed up to its next evaluation, and the reasons a run
ends at one (its state only; no model, no process group)."""

import pytest
import torch

from dlrm.config import TrainerConfig
from dlrm.trainer.evaluator import Evaluator


def evaluator(**trainer) -> Evaluator:
    return Evaluator(TrainerConfig(**trainer), ["click"], 256, torch.device("cpu"), None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "every, step, total, expected",
    [(10, 0, 25, 10), (10, 10, 25, 10), (10, 20, 25, 5), (10, 13, 25, 7), (0, 4, 25, 21)],
)
def test_the_feed_reaches_the_next_evaluation_or_the_end(every, step, total, expected):
    assert evaluator(eval_every_steps=every).steps_to_next(step, total) == expected


def test_a_run_ends_at_the_target_auc_once_and_says_when():
    e = evaluator(target_auc=0.7)
    assert e.stop_reason({"auc": 0.65}, 10) is None
    assert (
        e.stop_reason({"auc": 0.71}, 20) == "target AUC 0.7 reached at step 20 (5,120 samples): auc 0.71000; stopping"
    )
    assert e.stop_reason({"auc": 0.72}, 30) is None  # reached once
    assert e.summary_fields({}) == {
        "target_auc": 0.7, "reached_target": True, "steps_to_target": 20, "samples_to_target": 5120,
    }  # fmt: skip


def test_a_run_ends_when_the_selected_metric_stops_improving():
    e = evaluator(select_metric="logloss", patience=2)
    assert [e.stop_reason({"logloss": v}, s) for s, v in ((10, 0.5), (20, 0.4), (30, 0.45))] == [None] * 3
    assert e.stop_reason({"logloss": 0.41}, 40) == (
        "logloss has not improved on 0.40000 (step 20) in 2 evaluation(s): stopping at step 40"
    )
    assert e.summary_fields({})["best_step"] == 20 and e.summary_fields({})["stopped_early"]
