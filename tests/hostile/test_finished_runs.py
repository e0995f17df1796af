"""A finished run keeps its records: the same command with trainer.resume=auto after the run has ended
(or a resume from its final checkpoint) says "already finished at step N" in one line, exits 0 and
changes nothing (summary.json, metrics.jsonl, config.yaml, continuations.jsonl, `.hydra/`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN = (
    "model=tiny",
    "data.global_batch_size=64",
    "data.eval_batches=1",
    "trainer.max_steps=2",
    "trainer.progress=none",
    "trainer.tensorboard=false",
)


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlrm.train", *RUN, f"hydra.run.dir={run_dir}", *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _records(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock" and "checkpoints" not in p.parts
    }


@pytest.mark.slow
def test_a_rerun_of_a_finished_run_says_so_and_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    first = _train(run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _records(run_dir)
    assert b'"final_loss": null' not in before["summary.json"]
    for again in (
        _train(run_dir, "trainer.resume=auto"),
        _train(run_dir, f"trainer.resume={run_dir}/checkpoints/step_00000002"),
    ):
        text = again.stdout + again.stderr
        assert again.returncode == 0, text[-3000:]
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("already finished at step 2 "), text[-3000:]
        assert _records(run_dir) == before  # summary, metrics, config, train.log, .hydra/: untouched
    assert not (run_dir / "continuations.jsonl").exists()


def test_only_the_newest_checkpoint_at_the_end_is_finished(tmp_path):
    from dlrm.trainer.run_dir import finished_at, planned_steps

    ckpts = [tmp_path / f"step_{s:08d}" for s in (5, 10)]
    assert finished_at(ckpts, "auto", 10) == 10
    assert finished_at(ckpts, str(ckpts[1]), 10) == 10
    assert finished_at(ckpts, "auto", 11) is None  # max_steps raised: trains on
    assert finished_at(ckpts, str(tmp_path / "other" / "step_00000010"), 10) is None  # another run's weights
    assert finished_at([], "auto", 10) is None
    assert planned_steps(10, 320, 64) == 5 and planned_steps(10, None, 64) == 10


@pytest.mark.slow
def test_a_continuation_refuses_a_config_yaml_edited_since_the_run_recorded_it(tmp_path):
    """A run's settings come from what it recorded: its checkpoints' manifest names config.yaml's
    sha256, so a hand edit (here: the table size, which an override could not change) is refused in
    one line; the restored file continues."""
    run_dir = tmp_path / "run"
    assert _train(run_dir).returncode == 0
    config = run_dir / "config.yaml"
    recorded = config.read_bytes()
    assert b"rows: 100\n" in recorded
    config.write_bytes(recorded.replace(b"rows: 100\n", b"rows: 99\n", 1))
    edited = _train(run_dir, "trainer.resume=auto", "trainer.max_steps=4")
    text = edited.stdout + edited.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert edited.returncode == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert str(config) in errors[0] and "restore it" in errors[0], errors[0]
    config.write_bytes(recorded)
    restored = _train(run_dir, "trainer.resume=auto", "trainer.max_steps=4")
    assert restored.returncode == 0, (restored.stdout + restored.stderr)[-3000:]
