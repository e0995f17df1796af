"""trainer.dense_sync=local_sgd: torch's post-local SGD on the dense part (dlrm.distributed.local_sgd).

The runs are jobs of the 2-rank family (tests/helpers/families.py); the rank functions that look
inside a run (the weights after each step, the allreduces) are defined here.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dlrm.config import Config
from dlrm.export import export
from tests.helpers.cli import assert_one_error, main_in_process
from tests.helpers.equivalence import STEPS, matches, tiny
from tests.helpers.families import LONG_PAIR, PAIR, Overrides, runs
from tests.helpers.workers import build_trainer, train_and_report, train_losses, train_summary

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


def _replicated_params(trainer) -> list[torch.nn.Parameter]:
    """The parameters DDP replicates (the dense ones; it ignores the sharded tables)."""
    ddps = [m for m in trainer.model.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel)]
    return [p for ddp in ddps for n, p in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore]


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """A copy of `params`, flattened [n]."""
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


@pytest.mark.slow
@runs(results=PAIR.job(train_and_report, tiny("sharding=table_wise", *LOCAL, "trainer.sync_period=1")))
def test_period_one_equals_synchronous_training(results):
    """With SGD, averaging the weights after every local step is averaging the gradients."""
    matches(results, tiny("sharding=table_wise"))


def dense_after_each_step(cfg: Config) -> dict:
    """On each rank: train, the optimizer's step wrapped to copy the replicated weights right after
    each step (the pipeline's steps too); those copies, the final ones and the losses."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    snapshots, params, step = [], _replicated_params(trainer), trainer.optimizer.step

    def step_and_snapshot(*args, **kwargs):
        step(*args, **kwargs)
        snapshots.append(_flat(params))

    trainer.optimizer.step = step_and_snapshot  # the pipeline calls the instance's step
    train(trainer)
    return {"steps": snapshots, "final": _flat(_replicated_params(trainer)), "losses": trainer.losses}


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["table_wise", "data_parallel"])
@runs(
    ranks=lambda sharding: PAIR.job(
        dense_after_each_step, tiny(f"sharding={sharding}", *LOCAL, "trainer.sync_period=4")
    )
)
def test_ranks_agree_right_after_each_averaging_step_only(sharding, ranks):
    """The replicated weights (the MLPs; with data_parallel, the tables too) drift apart between averagings."""
    r0, r1 = ranks
    assert len(r0["steps"]) == STEPS == 8
    for step, (a, b) in enumerate(zip(r0["steps"], r1["steps"], strict=True), start=1):
        if step % 4 == 0:
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"step {step}")
        else:
            assert (a - b).abs().max() > 1e-6, f"the ranks' dense weights agree at step {step}: no local steps"
    assert r0["losses"] == r1["losses"]


@pytest.mark.slow
@runs(ranks=PAIR.job(dense_after_each_step, tiny(*LOCAL, "trainer.sync_period=2", "trainer.local_sgd_warmup_steps=4")))
def test_warmup_steps_are_synchronous(ranks):
    r0, r1 = ranks
    agree = [bool(torch.equal(a, b)) for a, b in zip(r0["steps"], r1["steps"], strict=True)]
    assert agree == [True, True, True, True, False, True, False, True]


def count_allreduces(cfg: Config) -> dict:
    """On each rank: train under torch.profiler; how many allreduces ran (c10d's dispatched op: DDP's,
    the averager's, the trainer's own), and the final replicated weights."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(trainer)
    names = [e.name for e in prof.events() or []]
    return {
        "allreduces": sum(1 for n in names if n == "c10d::allreduce_"),
        "names": sorted({n for n in names if n.startswith("c10d::") or "gloo" in n}),
        "final": _flat(_replicated_params(trainer)),
    }


@pytest.mark.slow
@runs(
    sync=PAIR.job(count_allreduces, tiny(*COUNTED)),
    local=PAIR.job(count_allreduces, tiny(*COUNTED, *LOCAL, "trainer.sync_period=4")),
)
def test_allreduces_drop_by_the_period_and_the_run_ends_averaged(sync, local):
    """10 steps, H=4: averages after steps 4 and 8, and once more at the end (step 10 is not an
    averaging step), instead of DDP's allreduce of the gradients in each of the 10 backward passes."""
    print(f"allreduces in 10 steps: synchronous {sync[0]['allreduces']}, local SGD H=4 {local[0]['allreduces']}")
    other = local[0]["allreduces"] - 3  # the trainer's own (the logged loss)
    assert other >= 0, local[0]
    assert sync[0]["allreduces"] - other >= 10, sync[0]  # one bucket or more per backward pass
    assert local[0]["allreduces"] == other + 3
    torch.testing.assert_close(local[0]["final"], local[1]["final"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.long
@runs(
    sync=LONG_PAIR.job(train_summary, Overrides(*QUIET)),
    local=LONG_PAIR.job(train_summary, Overrides(*QUIET, *LOCAL, "trainer.sync_period=4")),
)
def test_default_job_with_period_four_reaches_the_synchronous_auc(sync, local):
    """The main job (model=dlrm_small, 200 steps, 2 ranks): local SGD every 4 steps loses < 0.005 AUC."""
    sync, local = sync[0], local[0]
    print(f"eval AUC: synchronous {sync['eval_auc']:.5f}, local SGD H=4 {local['eval_auc']:.5f}")
    assert sync["eval_auc"] > 0.6, "the synthetic task must be learnt, or the comparison says little"
    assert abs(local["eval_auc"] - sync["eval_auc"]) < 0.005


AT_4 = PAIR.dir("local_whole") / "step_00000004"


@pytest.mark.slow
@runs(
    whole=PAIR.job(train_losses, _resumable("local_whole")),
    same=PAIR.job(train_losses, _resumable("local_same", f"trainer.resume={AT_4}")),
)
def test_resumed_equals_uninterrupted(tmp_path, whole, same):
    """Saved at an averaging step (4) after the warm-up, resumed to step 7 (not one: the run ends
    with an average): the resume restores the hook's and the averager's step counts."""
    whole, same = whole[0], same[0]  # rank 0's losses
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
