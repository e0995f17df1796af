"""trainer.dense_sync=local_sgd: torch's post-local SGD on the dense part (dlrm.distributed.local_sgd).

The runs are jobs of the 2-rank family (tests/helpers/families.py).
"""

import pytest
import torch

from dlrm.export import export
from tests.helpers.cli import assert_one_error, main_in_process
from tests.helpers.equivalence import STEPS, matches, tiny
from tests.helpers.families import LONG_PAIR, PAIR, Overrides
from tests.helpers.local_sgd_workers import count_allreduces, dense_after_each_step
from tests.helpers.workers import train_and_report, train_losses, train_summary

LOCAL = ("trainer.dense_sync=local_sgd",)
COUNTED = ("sharding=table_wise", "trainer.max_steps=10", "trainer.log_every_steps=10", "trainer.breakdown=false")
QUIET = ("trainer.progress=none",)


def _resumable(name, *overrides):
    """Saved every 2 steps, period 2 after a 2-step warm-up, 7 steps, into the family's directory `name`."""
    return tiny(
        "sharding=table_wise",
        *LOCAL,
        "trainer.sync_period=2",
        "trainer.local_sgd_warmup_steps=2",
        "trainer.max_steps=7",
        "checkpoint.every_steps=2",
        "checkpoint.keep=5",
        f"checkpoint.dir={PAIR.dir(name)}",
        *overrides,
    )


PERIOD_ONE = PAIR.add(
    "local_sgd/period1", train_and_report, tiny("sharding=table_wise", *LOCAL, "trainer.sync_period=1")
)
AGREE = {
    sharding: PAIR.add(
        f"local_sgd/agree/{sharding}",
        dense_after_each_step,
        tiny(f"sharding={sharding}", *LOCAL, "trainer.sync_period=4"),
    )
    for sharding in ("table_wise", "data_parallel")
}
WARMUP = PAIR.add(
    "local_sgd/warmup",
    dense_after_each_step,
    tiny(*LOCAL, "trainer.sync_period=2", "trainer.local_sgd_warmup_steps=4"),
)
COUNT_SYNC = PAIR.add("local_sgd/count/sync", count_allreduces, tiny(*COUNTED))
COUNT_LOCAL = PAIR.add("local_sgd/count/local", count_allreduces, tiny(*COUNTED, *LOCAL, "trainer.sync_period=4"))
MAIN_JOB_SYNC = LONG_PAIR.add("main_job/sync", train_summary, Overrides(*QUIET))
MAIN_JOB_LOCAL = LONG_PAIR.add("main_job/local_sgd", train_summary, Overrides(*QUIET, *LOCAL, "trainer.sync_period=4"))
WHOLE = PAIR.add("local_sgd/resume/whole", train_losses, _resumable("local_whole"))
_AT_4 = PAIR.dir("local_whole") / "step_00000004"
RESUMED = PAIR.add("local_sgd/resume/same", train_losses, _resumable("local_same", f"trainer.resume={_AT_4}"))


@pytest.mark.slow
def test_period_one_equals_synchronous_training():
    """With SGD, averaging the weights after every local step is averaging the gradients."""
    matches(PERIOD_ONE.results(), tiny("sharding=table_wise"))


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "data_parallel"])
def test_ranks_agree_right_after_each_averaging_step_only(sharding):
    """The replicated weights (the MLPs; with data_parallel, the tables too) drift apart between averagings."""
    r0, r1 = AGREE[sharding].results()
    assert len(r0["steps"]) == STEPS == 8
    for step, (a, b) in enumerate(zip(r0["steps"], r1["steps"], strict=True), start=1):
        if step % 4 == 0:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"step {step}")
        else:
            assert (a - b).abs().max() > 1e-6, f"the ranks' dense weights agree at step {step}: no local steps"
    assert r0["losses"] == r1["losses"]


@pytest.mark.slow
def test_warmup_steps_are_synchronous():
    r0, r1 = WARMUP.results()
    agree = [bool(torch.equal(a, b)) for a, b in zip(r0["steps"], r1["steps"], strict=True)]
    assert agree == [True, True, True, True, False, True, False, True]


@pytest.mark.slow
def test_allreduces_drop_by_the_period_and_the_run_ends_averaged():
    """10 steps, H=4: averages after steps 4 and 8, and once more at the end (step 10 is not an
    averaging step), instead of DDP's allreduce of the gradients in each of the 10 backward passes."""
    sync, local = COUNT_SYNC.results(), COUNT_LOCAL.results()
    print(f"allreduces in 10 steps: synchronous {sync[0]['allreduces']}, local SGD H=4 {local[0]['allreduces']}")
    other = local[0]["allreduces"] - 3  # the trainer's own (the logged loss)
    assert other >= 0, local[0]
    assert sync[0]["allreduces"] - other >= 10, sync[0]  # one bucket or more per backward pass
    assert local[0]["allreduces"] == other + 3
    torch.testing.assert_close(local[0]["final"], local[1]["final"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.long
def test_default_job_with_period_four_reaches_the_synchronous_auc():
    """The main job (model=dlrm_small, 200 steps, 2 ranks): local SGD every 4 steps loses < 0.005 AUC."""
    sync, local = MAIN_JOB_SYNC.results()[0], MAIN_JOB_LOCAL.results()[0]
    print(f"eval AUC: synchronous {sync['eval_auc']:.5f}, local SGD H=4 {local['eval_auc']:.5f}")
    assert sync["eval_auc"] > 0.6, "the synthetic task must be learnt, or the comparison says little"
    assert abs(local["eval_auc"] - sync["eval_auc"]) < 0.005


@pytest.mark.slow
def test_resumed_equals_uninterrupted(tmp_path):
    """Saved at an averaging step (4) after the warm-up, resumed to step 7 (not one: the run ends
    with an average): the resume restores the hook's and the averager's step counts."""
    whole, same = WHOLE.results()[0], RESUMED.results()[0]
    assert len(whole) == 7 and same == whole[4:]
    final = {
        name: export(PAIR.dir(f"local_{name}") / "step_00000007", tmp_path / f"{name}.pt") for name in ("whole", "same")
    }
    for key, expected in final["whole"].items():
        assert torch.equal(final["same"][key], expected), key


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["trainer.sync_period=0"], ["trainer.sync_period", "0", ">= 1"]),
        (["trainer.sync_period=-2"], ["trainer.sync_period", "-2", ">= 1"]),
        ([*LOCAL, "trainer.sync_period=0"], ["trainer.sync_period", "0", ">= 1"]),
        (["trainer.sync_period=4"], ["trainer.sync_period", "trainer.dense_sync=local_sgd"]),
        (
            [*LOCAL, "trainer.dense_allreduce=hierarchical"],
            ["trainer.dense_allreduce", "hierarchical", "trainer.dense_sync=local_sgd", "flat"],
        ),
        ([*LOCAL, "trainer.local_sgd_warmup_steps=-1"], ["trainer.local_sgd_warmup_steps", "-1"]),
        (
            [*LOCAL, "trainer.sync_period=4", "trainer.local_sgd_warmup_steps=6"],
            ["trainer.local_sgd_warmup_steps", "multiple of trainer.sync_period=4"],
        ),
        (
            [*LOCAL, "trainer.sync_period=4", "checkpoint.every_steps=10"],
            ["checkpoint.every_steps", "10", "multiple of trainer.sync_period=4"],
        ),
        (
            [*LOCAL, "trainer.sync_period=4", "trainer.eval_every_steps=6"],
            ["trainer.eval_every_steps", "6", "multiple of trainer.sync_period=4"],
        ),
    ],
)
def test_bad_local_sgd_config_is_one_error_line(monkeypatch, capsys, overrides, words):
    assert_one_error(*main_in_process(monkeypatch, capsys, *overrides), *words)
