"""Training over time on two ranks: a run killed and resumed over several partitions equals the
uninterrupted run; a continuation over an added day trains on that day's rows (and the unfinished
ones) only, with max_epochs; every evaluation reports its figures per evaluated period."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlrm.config import Config
from tests.helpers.equivalence import tiny
from tests.helpers.families import PAIR, runs
from tests.helpers.pages import run_page
from tests.helpers.parquet_data import overrides
from tests.helpers.periods_data import PER_DAY, write_days


def days_then_train(cfg: Config, run_dir: str) -> dict:
    """Rank 0 writes the days of tests/data/test_periods.py into cfg.data.parquet.path (once); then every
    rank trains in `run_dir`: losses, this rank's weights, summary, rank 0's metrics.jsonl records."""
    from dlrm.config import validate, validate_world
    from dlrm.distributed.world import World
    from dlrm.trainer.build import build
    from dlrm.trainer.loop import train
    from tests.helpers.harness import default_group
    from tests.helpers.workers import pieces_of

    world = World.from_env()
    data = Path(str(cfg.data.parquet.path))
    if world.rank == 0 and not data.exists():
        data.mkdir(parents=True)
        write_days(data)
    torch.distributed.barrier(group=default_group())
    validate(cfg)
    validate_world(cfg, world.world_size, world.local_world_size)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    trainer = build(cfg, world, Path(run_dir))
    summary = train(trainer)
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if world.is_main else []
    return {
        "losses": trainer.losses,
        "pieces": pieces_of(trainer.detached_model()),
        "summary": summary,
        "records": [json.loads(line) for line in lines],
    }


DATA = PAIR.dir("days")


def days(train: str, *more: str):
    base = [o for o in overrides(DATA) if "eval_fraction" not in o]
    return tiny(
        "sharding=row_wise",
        "optim=rowwise_adagrad",
        "optim.schedule.warmup_steps=4",
        *base,
        "data.parquet.periods.key=day",
        f"data.parquet.periods.train={train}",
        "data.parquet.periods.eval=[11,11]",
        *more,
    )


# The runs, each a job of the PAIR family; a resume is declared after the run it resumes.
# 3 days of 192 rows, batch 96: 6 steps a pass; two passes, checkpoints every 4 steps
WHOLE = PAIR.job(
    days_then_train,
    days(
        "[8,10]",
        "trainer.max_epochs=2",
        f"checkpoint.dir={PAIR.dir('p_whole')}",
        "checkpoint.every_steps=4",
        "checkpoint.keep=3",
    ),
    str(PAIR.dir("p_whole_run")),
)
RESUMED = PAIR.job(
    days_then_train,
    days(
        "[8,10]",
        "trainer.max_epochs=2",
        f"checkpoint.dir={PAIR.dir('p_resumed')}",
        f"trainer.resume={PAIR.dir('p_whole') / 'step_00000004'}",
    ),
    str(PAIR.dir("p_resumed_run")),
)
# days 8-9 once (4 steps), then day 10 added: 2 more steps, on day 10's rows only
FIRST = PAIR.job(
    days_then_train,
    days("[8,9]", "trainer.max_epochs=1", f"checkpoint.dir={PAIR.dir('p_first')}"),
    str(PAIR.dir("p_first_run")),
)
CONTINUED = PAIR.job(
    days_then_train,
    days(
        "[8,10]",
        "trainer.max_epochs=1",
        f"checkpoint.dir={PAIR.dir('p_continued')}",
        f"trainer.resume={PAIR.dir('p_first') / 'step_00000004'}",
    ),
    str(PAIR.dir("p_continued_run")),
)
RESTARTED = PAIR.job(
    days_then_train,
    days(
        "[8,10]",
        "trainer.max_epochs=1",
        "optim.schedule.on_new_data=restart",
        f"checkpoint.dir={PAIR.dir('p_restarted')}",
        f"trainer.resume={PAIR.dir('p_first') / 'step_00000004'}",
    ),
    str(PAIR.dir("p_restarted_run")),
)
# random labels: more passes only overfit, so NE stops improving and patience ends the run
EARLY = PAIR.job(
    days_then_train,
    days(
        "[8,10]",
        "trainer.max_epochs=6",
        "trainer.eval_every_steps=3",
        "trainer.select_metric=ne",
        "trainer.patience=2",
        "optim.dense.lr=0.5",
        "optim.embedding.lr=0.5",
        f"checkpoint.dir={PAIR.dir('p_early')}",
    ),
    str(PAIR.dir("p_early_run")),
)


@pytest.mark.slow
@runs(whole=WHOLE, resumed=RESUMED)
def test_a_run_resumed_over_several_partitions_equals_the_uninterrupted_one(whole, resumed):
    assert whole[0]["summary"]["steps"] == resumed[0]["summary"]["steps"] == 12
    for rank in range(2):
        assert resumed[rank]["losses"] == pytest.approx(whole[rank]["losses"][4:], rel=1e-5, abs=1e-6)
        for name, pieces in whole[rank]["pieces"].items():
            for (offsets, a), (_, b) in zip(pieces, resumed[rank]["pieces"][name], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name} at {offsets}")


@pytest.mark.slow
@runs(first=FIRST, continued=CONTINUED)
def test_a_continuation_trains_on_the_added_day_only(first, continued):
    assert first[0]["summary"]["steps"] == 2 * PER_DAY // 96
    assert continued[0]["summary"]["steps"] == 3 * PER_DAY // 96  # two more: day 10's 192 rows
    assert continued[0]["summary"]["this_invocation"]["steps"] == PER_DAY // 96


@pytest.mark.slow
@runs(first=FIRST)
def test_every_evaluation_reports_each_period(first):
    result = first[0]
    periods = result["summary"]["eval_periods"]
    assert list(periods) == ["11"] and periods["11"]["samples"] == PER_DAY // 96 * 96
    assert periods["11"]["auc"] == pytest.approx(result["summary"]["eval_auc"], abs=1e-12)  # one period: the same
    evals = [r for r in result["records"] if "eval_auc" in r]
    assert evals and all("11/auc" in r["eval_periods"] and "11/ne" in r["eval_periods"] for r in evals)


@pytest.mark.slow
def test_the_training_over_time_page_runs_as_written(tmp_path, capfd):
    """docs/training-over-time.md: its commands as they are: a log written, inspected, day 1 trained
    with progressive validation on day 2, then day 2 continued by hand with deltas, exported and applied."""
    outputs = run_page("training-over-time.md", tmp_path, capfd)
    table = json.loads((tmp_path / "outputs" / "daily" / "progressive.json").read_text())["periods"]
    assert [row["period"] for row in table] == [2]
    assert all(row["rows_trained"] == 2048 and 0.5 < row["auc"] < 1 for row in table)
    assert "data: continuing at step 4 on 2,048 row(s) not read yet" in outputs[3]
    assert "period 3: auc" in outputs[3] and "done: 8 steps" in outputs[3]
    assert "6        4" in outputs[5] and "8        6" in outputs[5]  # the deltas of day 2: 4 -> 6 -> 8
    day2 = torch.load(tmp_path / "day2.pt", weights_only=True)
    assert day2["step"] == 8 and "wrote" in outputs[6]


@pytest.mark.slow
@runs(first=FIRST, continued=CONTINUED, restarted=RESTARTED)  # both resume the first run's checkpoint
def test_the_schedule_continues_or_restarts_on_new_data(first, continued, restarted):
    def lrs(result) -> dict[int, float]:
        return {r["step"]: r["lr"] for r in result[0]["records"] if "lr" in r}

    lr = 0.05  # optim=rowwise_adagrad's dense lr; warm-up 4 steps
    continued, restarted = lrs(continued), lrs(restarted)
    assert continued[5] == pytest.approx(lr) and continued[6] == pytest.approx(lr)  # the clock is the step
    assert restarted[5] == pytest.approx(lr / 4) and restarted[6] == pytest.approx(lr / 2)  # warm-up again


@pytest.mark.slow
@runs(early=EARLY)
def test_early_stopping_ends_the_run_after_patience_evaluations_without_a_better_ne(early):
    result = early[0]
    summary = result["summary"]
    nes = {r["step"]: r["eval_ne"] for r in result["records"] if "eval_ne" in r}
    assert summary["stopped_early"] and summary["steps"] < 36
    best_step = min(nes, key=lambda step: nes[step])
    assert (summary["best_step"], summary["best_value"]) == (best_step, pytest.approx(nes[best_step]))
    assert summary["steps"] == best_step + 2 * 3  # two evaluations after the best, none better


def test_patience_needs_a_metric_and_evaluations():
    from dlrm.config import ConfigError, validate
    from dlrm.config.compose import compose

    with pytest.raises(ConfigError, match=r"trainer.patience.*set trainer.select_metric"):
        validate(compose(["trainer.patience=2", "trainer.eval_every_steps=5"]))
    with pytest.raises(ConfigError, match=r"trainer.select_metric.*use auc, ne or logloss"):
        validate(compose(["trainer.select_metric=accuracy"]))
