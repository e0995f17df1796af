"""A checkpoint is good only if it is finite: a diverged model is never saved (so no NaN checkpoint
is ever called "last good", and retention only ever deletes finite ones in favour of newer finite
ones), and a checkpoint holding NaN or inf (written by an older version or another program) is
refused at load with one message naming it and the fix."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dlrm.checkpoint import (
    CheckpointError,
    complete_checkpoints,
    file_digest,
    load_checkpoint,
    nonfinite_tensors,
    write_manifest,
)
from dlrm.export import export
from tests.helpers.equivalence import tiny
from tests.helpers.families import PAIR, error_of, runs
from tests.helpers.workers import train_summary

ROOT = PAIR.dir("diverging")
EVERY_STEP = (f"checkpoint.dir={ROOT}", "checkpoint.every_steps=1", "checkpoint.keep=2", "optim=sgd")
DIVERGING = ("trainer.log_every_steps=5", "optim.dense.lr=1e30", "optim.embedding.lr=1e30", "trainer.resume=auto")


@pytest.mark.slow
@runs(
    good=PAIR.job(train_summary, tiny(*EVERY_STEP, "trainer.max_steps=4")),
    # the case: saved every step, the loss looked at every 5th only
    diverged=PAIR.job(train_summary, tiny(*EVERY_STEP, "trainer.max_steps=12", *DIVERGING), expect_error=True),
)
def test_a_diverged_model_is_not_saved_and_the_last_good_checkpoint_is_finite(tmp_path, good, diverged):
    error = error_of(diverged)
    assert error.type == "NonFiniteCheckpointError", error
    assert "not checkpointed" in error.message and "hold NaN or inf" in error.message, error
    named = error.message.split("last good checkpoint: ")[1].split(". ")[0]
    kept = complete_checkpoints(ROOT)
    assert str(kept[-1]) == named, (named, kept)
    assert [p.name for p in kept][:2] == ["step_00000003", "step_00000004"]  # the first run's, never deleted
    for ckpt in kept:  # every checkpoint left is a good one
        exported = export(ckpt, tmp_path / f"{ckpt.name}.pt")
        assert all(torch.isfinite(t).all() for t in exported.values() if t.is_floating_point()), ckpt


def _saved(tmp_path, value: float):
    """A one-process DCP checkpoint of {"model": {"w": [1, value]}} at step 3, with its manifest."""
    ckpt = tmp_path / "step_00000003"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {"model": {"w": torch.tensor([1.0, value])}, "progress": {"step": torch.tensor([3])}},
            checkpoint_id=str(ckpt),
            no_dist=True,
        )
    write_manifest(ckpt, {"step": 3, "files": {p.name: file_digest(p) for p in ckpt.iterdir()}})
    return ckpt


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_nonfinite_checkpoint_is_refused_at_load(tmp_path, value):
    ckpt = _saved(tmp_path, value)
    state = {"model": {"w": torch.zeros(2)}, "progress": {"step": torch.tensor([0])}}
    with pytest.raises(CheckpointError, match=r"holds NaN or inf in 1 tensors \(model\.w\).*use another checkpoint"):
        load_checkpoint(ckpt, state)


def test_a_finite_checkpoint_loads(tmp_path):
    state = {"model": {"w": torch.zeros(2)}, "progress": {"step": torch.tensor([0])}}
    load_checkpoint(_saved(tmp_path, 2.0), state)
    assert state["model"]["w"].tolist() == [1.0, 2.0]


def test_nonfinite_tensors_names_each_float_tensor_with_nan_or_inf():
    state = {
        "model": {"a": torch.ones(3), "b": torch.tensor([0.0, float("nan")]), "ids": torch.arange(3)},
        "optim": {"state": {"b": {"sum": torch.tensor([float("inf")])}}},
    }
    assert nonfinite_tensors(state) == ["model.b", "optim.state.b.sum"]
