"""An evaluation in the middle of a pipelined run: the training is the one without it, the pipeline
holds no batch when the evaluation's forward runs, and its model is attached again before the next
step (which PrefetchTrainPipelineSparseDist needs: tests/helpers/pipelines.py), over 2 Gloo ranks."""

import pytest
import torch

from tests.helpers.equivalence import tiny
from tests.helpers.families import PAIR, runs
from tests.helpers.pipelines import train_with_stand_in_pipeline
from tests.helpers.workers import train_and_report

EVAL_EVERY = 3  # evaluations after steps 3 and 6 of the 8 (and at the end)
MID_RUN = tiny(f"trainer.eval_every_steps={EVAL_EVERY}")
END_ONLY = tiny("trainer.eval_every_steps=0")


def assert_same_training(results, baseline):
    """Same losses and weights as the baseline's: the same maths in the same order, so bit-exact."""
    for rank, (result, base) in enumerate(zip(results, baseline, strict=True)):
        assert result["losses"] == base["losses"], f"rank {rank}"
        for name, pieces in result["pieces"].items():
            for (offsets, piece), (base_offsets, base_piece) in zip(pieces, base["pieces"][name], strict=True):
                assert offsets == base_offsets and torch.equal(piece, base_piece), f"{name} on rank {rank}"


@pytest.mark.slow
@runs(
    baseline=PAIR.job(train_and_report, END_ONLY),
    mid_run=PAIR.job(train_and_report, MID_RUN),
    stand_in=PAIR.job(train_with_stand_in_pipeline, MID_RUN),
)
def test_a_mid_run_evaluation_leaves_the_training_as_without_it(baseline, mid_run, stand_in):
    assert len(baseline[0]["losses"]) == 8
    assert_same_training(mid_run, baseline)
    assert_same_training(stand_in, baseline)


@pytest.mark.slow
@runs(stand_in=PAIR.job(train_with_stand_in_pipeline, MID_RUN))
def test_the_pipeline_is_empty_at_each_evaluation_and_attached_after_it(stand_in):
    for rank, result in enumerate(stand_in):
        calls = result["calls"]
        detaches = [i for i, (name, _) in enumerate(calls) if name == "detach"]
        assert len(detaches) == 4, calls  # after steps 3, 6 and 8, and for the final weights
        assert all(calls[i][1] == 0 for i in detaches), f"rank {rank}: batches held at an evaluation: {calls}"
        for i in detaches[:-1]:  # the next call re-attaches, before any step
            assert calls[i + 1][0] == "attach", f"rank {rank}: {calls}"
        assert [name for name, _ in calls].count("progress") == 8
