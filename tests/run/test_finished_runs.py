"""A finished run keeps its records: the same command with trainer.resume=auto after the run has ended
(or a resume from its final checkpoint) says "already finished at step N" in one line, exits 0 and
changes nothing (summary.json, metrics.jsonl, config.yaml, continuations.jsonl, `.hydra/`), except a
summary.json gone missing, which it rebuilds; a continuation's summary covers the whole run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import train_in_process

RUN = (
    "model=tiny",
    "data.global_batch_size=64",
    "data.eval_batches=1",
    "trainer.max_steps=2",
    "trainer.progress=none",
    "trainer.tensorboard=false",
)


def _train(capfd, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m dlrm.train` from the repository, run in the test process (tests/helpers/cli.py)."""
    args = (*RUN, f"hydra.run.dir={run_dir}", *overrides)
    code, out, err = train_in_process(capfd, *args, cwd=REPO)
    return subprocess.CompletedProcess(["dlrm.train", *args], code, out, err)


def _records(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock" and "checkpoints" not in p.parts
    }


@pytest.mark.slow
def test_a_rerun_of_a_finished_run_says_so_and_changes_nothing(capfd, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(capfd, run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _records(run_dir)
    assert b'"final_loss": null' not in before["summary.json"]
    for again in (
        _train(capfd, run_dir, "trainer.resume=auto"),
        _train(capfd, run_dir, f"trainer.resume={run_dir}/checkpoints/step_00000002"),
    ):
        text = again.stdout + again.stderr
        assert again.returncode == 0, text[-3000:]
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("already finished at step 2 "), text[-3000:]
        assert _records(run_dir) == before  # summary, metrics, config, train.log, .hydra/: untouched
    assert not (run_dir / "continuations.jsonl").exists()


def test_only_the_newest_checkpoint_at_the_end_is_finished(tmp_path):
    from dlrm.run.records import finished_at, planned_steps

    ckpts = [tmp_path / f"step_{s:08d}" for s in (5, 10)]
    assert finished_at(ckpts, "auto", 10) == 10
    assert finished_at(ckpts, str(ckpts[1]), 10) == 10
    assert finished_at(ckpts, "auto", 11) is None  # max_steps raised: trains on
    assert finished_at(ckpts, str(tmp_path / "other" / "step_00000010"), 10) is None  # another run's weights
    assert finished_at([], "auto", 10) is None
    assert planned_steps(10, 320, 64) == 5 and planned_steps(10, None, 64) == 10


@pytest.mark.slow
def test_a_continuation_refuses_a_config_yaml_edited_since_the_run_recorded_it(capfd, tmp_path):
    """A run's settings come from what it recorded: its checkpoints' manifest names config.yaml's
    sha256, so a hand edit (here: the table size, which an override could not change) is refused in
    one line; the restored file continues."""
    run_dir = tmp_path / "run"
    assert _train(capfd, run_dir).returncode == 0
    config = run_dir / "config.yaml"
    recorded = config.read_bytes()
    assert b"rows: 100\n" in recorded
    config.write_bytes(recorded.replace(b"rows: 100\n", b"rows: 99\n", 1))
    edited = _train(capfd, run_dir, "trainer.resume=auto", "trainer.max_steps=4")
    text = edited.stdout + edited.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert edited.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert str(config) in errors[0] and "restore it" in errors[0], errors[0]
    config.write_bytes(recorded)
    restored = _train(capfd, run_dir, "trainer.resume=auto", "trainer.max_steps=4")
    assert restored.returncode == 0, (restored.stdout + restored.stderr)[-3000:]


def _manifest(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "manifest.json").read_text())


@pytest.mark.slow
def test_a_lost_summary_is_rebuilt_from_the_metrics_and_the_last_checkpoint(capfd, tmp_path):
    """A kill after the last checkpoint and before summary.json: the re-run says so in its one line,
    rebuilds the summary with the run's figures (the same loss, evaluation and throughput) and
    changes nothing else."""
    run_dir = tmp_path / "run"
    assert _train(capfd, run_dir).returncode == 0
    original = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()
    before = _records(run_dir)
    again = _train(capfd, run_dir, "trainer.resume=auto")
    text = again.stdout + again.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert again.returncode == 0 and len(lines) == 1, text[-3000:]
    assert lines[0].startswith("already finished at step 2 ") and "summary.json was missing: rebuilt" in lines[0]
    rebuilt = json.loads((run_dir / "summary.json").read_text())
    for key in ("steps", "world_size", "final_loss", "eval_auc", "eval_logloss", "eval_ne", "sharding_plan"):
        assert rebuilt[key] == original[key], key
    assert rebuilt["final_loss"] is not None and rebuilt["eval_auc"] is not None
    # the same seconds (the checkpoint recorded them after the last window closed), the same division
    assert rebuilt["train_samples_per_s"] == pytest.approx(original["train_samples_per_s"], rel=1e-12)
    assert rebuilt["rebuilt_from"] == [
        str(run_dir / "metrics.jsonl"),
        str(run_dir / "checkpoints/step_00000002/manifest.json"),
    ]
    after = _records(run_dir)
    assert after.pop("summary.json") and after == before  # nothing else changed


@pytest.mark.slow
def test_a_continuations_summary_covers_the_whole_run(capfd, tmp_path):
    """Two invocations (steps 1..2, then 3..4): summary.json's throughput and wall time are the
    run's (the first invocation's time as its step-2 checkpoint recorded it, plus the second's), and
    the second's own figures are under this_invocation."""
    run_dir = tmp_path / "run"
    assert _train(capfd, run_dir).returncode == 0
    first = _manifest(run_dir / "checkpoints/step_00000002")["run_time"]
    assert first["timed_steps"] == 2 and first["invocations"] == 1 and first["train_seconds"] > 0
    second = _train(capfd, run_dir, "trainer.resume=auto", "trainer.max_steps=4")
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    this = summary["this_invocation"]
    assert (summary["steps"], summary["timed_steps"], summary["invocations"]) == (4, 4, 2)
    assert (this["first_step"], this["steps"]) == (2, 2)
    this_seconds = this["steps"] * 64 / this["train_samples_per_s"]
    assert summary["train_samples_per_s"] == pytest.approx(4 * 64 / (first["train_seconds"] + this_seconds), rel=1e-9)
    assert summary["wall_time_s"] == pytest.approx(first["wall_seconds"] + this["wall_time_s"], rel=0.05)
    assert summary["wall_time_s"] > this["wall_time_s"]
    assert _manifest(run_dir / "checkpoints/step_00000004")["run_time"]["invocations"] == 2
    assert "trained 4 steps over 2 invocations" in second.stdout + second.stderr
