"""trainer.target_auc: training stops at the first evaluation that reaches it, on every rank alike."""

import json
import subprocess

import pytest

from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import train_in_process
from tests.helpers.families import PAIR, Overrides, runs
from tests.helpers.workers import train_summary

SMALL = ["data.global_batch_size=256", "data.eval_batches=4", "trainer.eval_every_steps=10", "trainer.progress=none"]


REACHABLE = Overrides(*SMALL, "trainer.max_steps=200", "trainer.log_every_steps=4", "trainer.target_auc=0.6")


@pytest.mark.slow
@runs(summaries=PAIR.job(train_summary, REACHABLE))
def test_a_reachable_target_stops_the_run_early(summaries):
    first = summaries[0]
    assert first["reached_target"] is True and first["target_auc"] == 0.6
    stop = first["steps_to_target"]
    assert stop % 10 == 0 and 10 <= stop < 200 and first["steps"] == stop
    assert first["samples_to_target"] == stop * 256 and first["eval_auc"] >= 0.6
    assert all(s["steps"] == stop for s in summaries)  # every rank stopped at the same step


@pytest.mark.slow
@runs(summaries=PAIR.job(train_summary, Overrides(*SMALL, "trainer.max_steps=20", "trainer.target_auc=0.999")))
def test_an_unreachable_target_runs_to_max_steps(summaries):
    first = summaries[0]
    assert first["reached_target"] is False and first["steps"] == 20
    assert first["steps_to_target"] is None and first["samples_to_target"] is None


@pytest.mark.slow
def test_the_stop_is_recorded_in_the_run_directory(capfd, tmp_path):
    """One process through dlrm.train (in the test process): summary.json, the console line, the last
    log window at the stop, and the trace still open then (trainer.profile up to step 1000) written."""
    code, out, err = train_in_process(
        capfd, *SMALL, "trainer.max_steps=200", "trainer.log_every_steps=4", "trainer.target_auc=0.6",
        "trainer.profile=[8,1000]", "trainer.progress=lines", f"hydra.run.dir={tmp_path}", cwd=REPO,
    )  # fmt: skip
    result = subprocess.CompletedProcess(["dlrm.train"], code, out, err)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    stop = summary["steps_to_target"]
    assert summary["reached_target"] and summary["steps"] == stop < 200
    assert f"target AUC 0.6 reached at step {stop}" in result.stdout
    assert f"target AUC 0.6: reached at step {stop} ({stop * 256:,} samples)" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records if "loss" in r) == stop  # the window up to the stop is logged
    assert list((tmp_path / "profile").glob("rank0*.pt.trace.json"))
