"""A training step with no log, evaluation or checkpoint due never makes the host wait for the
device: every sync point it can reach (`.item()`, `.tolist()`, a tensor's truth value, a copy to
the host, a blocking copy to the device, `torch.cuda.synchronize`, the trainer's own sync) is
counted by tests/helpers/sync_counter.py over 2 Gloo ranks, step by step, with and without the
pipeline. trainer.on_nonfinite=skip waits once per step, by design (see `Trainer.train_step`)."""

import pytest

from tests.helpers.families import PAIR, Overrides, runs
from tests.helpers.sync_counter import train_counting_syncs

STEPS, LOG, EVAL, CHECKPOINT = 9, 3, 4, 6
DUE = {s for s in range(1, STEPS + 1) if s % LOG == 0 or s % EVAL == 0 or s % CHECKPOINT == 0 or s == STEPS}
FREE = sorted(set(range(1, STEPS + 1)) - DUE)  # steps 1, 2, 5 and 7
COMMON = (
    "model=tiny",
    "data.global_batch_size=32",
    "data.eval_batches=2",
    "data.synthetic.on_device=false",  # made on the host and copied, as a GPU run's Criteo batches
    f"trainer.max_steps={STEPS}",
    f"trainer.log_every_steps={LOG}",
    f"trainer.eval_every_steps={EVAL}",
    f"checkpoint.every_steps={CHECKPOINT}",
    "trainer.breakdown=false",
    "trainer.progress=none",
)
JOBS = {
    "pipelined": (),
    "plain": ("trainer.pipeline=false",),
    "skip": ("trainer.pipeline=false", "trainer.on_nonfinite=skip"),
}


def counted_run(job):
    """The run `job` with its host waits counted (tests/helpers/sync_counter.py), in a directory of its own."""
    overrides = Overrides(*COMMON, *JOBS[job], f"checkpoint.dir={PAIR.dir(f'syncs_{job}')}")
    return PAIR.job(train_counting_syncs, overrides)


def ours(result: dict, steps) -> list[dict]:
    """The syncs of dlrm code in training steps `steps` and the loop's work after them."""
    return [s for s in result["syncs"] if s["ours"] and s["step"] in steps and s["phase"] != "start"]


@pytest.mark.slow
@pytest.mark.parametrize("job", ["pipelined", "plain"])
@runs(results=counted_run)
def test_a_step_with_nothing_due_never_waits_for_the_device(job, results):
    assert FREE == [1, 2, 5, 7]
    for rank, result in enumerate(results):
        assert result["steps"] == STEPS
        assert ours(result, FREE) == [], f"rank {rank}: host waits on steps with nothing due"
        # The counter is not blind: the waits that are due are seen, at their steps only.
        due = ours(result, DUE)
        assert {s["step"] for s in due if s["kind"] == "tolist" and "global_mean" in s["where"]} == {3, 6, 9}
        assert {s["step"] for s in due if s["kind"] == "synchronize"} == DUE


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(JOBS))
@runs(results=counted_run)
def test_batches_go_to_the_device_without_blocking(job, results):
    """The training step's and the evaluation's copies of a batch (pinned on a GPU) never block."""
    for rank, result in enumerate(results):
        copies = [s for s in result["syncs"] if s["ours"] and "copy" in s["kind"]]
        batch_copies = [s for s in copies if s["where"].endswith((" train_step", " evaluate"))]
        assert batch_copies == [], f"rank {rank}: {batch_copies}"


@pytest.mark.slow
@runs(results=counted_run("skip"))
def test_skipping_nonfinite_losses_waits_once_per_step(results):
    for rank, result in enumerate(results):
        waits = ours(result, FREE)
        assert [(s["step"], s["kind"]) for s in waits] == [(s, "item") for s in FREE], f"rank {rank}: {waits}"
        assert all(s["where"].endswith(" train_step") for s in waits)
