"""Named runs (run.name=NAME -> outputs/NAME) continue themselves with trainer.resume=auto.

Single-process `dlrm.train` in a temporary working directory: the named-run logic is the same on
every rank (all ranks read the run's config.yaml; rank 0 writes). The commands run in the test
process (tests/helpers/cli.py), except the killed run's, which needs a process to kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dlrm.export import main as export_main
from tests.helpers import REPO_ROOT as REPO
from tests.helpers.cli import train_in_process

BASE = [
    "model=tiny",
    "data.global_batch_size=64",
    "data.eval_batches=1",
    "trainer.progress=none",
    "trainer.log_every_steps=10",
]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlrm.train", *BASE, *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def train_process(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m dlrm.train` in its own process."""
    return subprocess.run(_cmd(*args), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def train(capfd, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m dlrm.train` run in the test process, its result as the process's."""
    code, out, err = train_in_process(capfd, *BASE, *args, cwd=cwd)
    return subprocess.CompletedProcess(_cmd(*args), code, out, err)


def steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))


def weights(tmp_path: Path, checkpoint: Path) -> dict:
    out = tmp_path / f"{checkpoint.parent.parent.name}.pt"
    assert export_main([str(checkpoint), str(out)]) == 0
    return torch.load(out, weights_only=True)["state_dict"]


@pytest.mark.slow
@pytest.mark.long
def test_a_killed_named_run_continues_to_the_uninterrupted_result(tmp_path):
    """Killed after its first checkpoint, the same command again resumes from it, keeps the run's
    config.yaml, and ends with the weights and loss of an uninterrupted run."""
    args = ("trainer.max_steps=300", "checkpoint.every_steps=5", "trainer.resume=auto")
    ref = train_process(tmp_path, "run.name=ref", *args)
    assert ref.returncode == 0, ref.stderr[-3000:]

    run = tmp_path / "outputs" / "crash"
    proc = subprocess.Popen(
        _cmd("run.name=crash", *args), cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while not (run / "checkpoints").is_dir() or not steps(run):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = steps(run)[-1]
    assert killed_at != "step_00000300", "the run finished before it was killed: nothing to continue"
    config = (run / "config.yaml").read_text()

    again = train_process(tmp_path, "run.name=crash", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    log = (run / "train.log").read_text()
    assert f"resumed from {run / 'checkpoints' / killed_at}" in log or f"checkpoints/{killed_at} at step" in log
    assert "with its config unchanged" in log
    assert (run / "config.yaml").read_text() == config  # the run's config is never rewritten
    (line,) = (run / "continuations.jsonl").read_text().splitlines()
    assert json.loads(line)["changes"] == {}

    final, expected = (
        json.loads((run / "summary.json").read_text()),
        json.loads((tmp_path / "outputs/ref/summary.json").read_text()),
    )
    assert final["steps"] == expected["steps"] == 300
    assert final["final_loss"] == pytest.approx(expected["final_loss"], rel=1e-5)
    got = weights(tmp_path, run / "checkpoints/step_00000300")
    want = weights(tmp_path, tmp_path / "outputs/ref/checkpoints/step_00000300")
    assert got.keys() == want.keys()
    for key in want:  # the same float operations in the same order: equal up to rounding
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_continuation_cannot_change_the_model_nor_restart_the_run(capfd, tmp_path):
    first = train(capfd, tmp_path, "run.name=r", "trainer.max_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]

    changed = train(
        capfd, tmp_path, "run.name=r", "trainer.max_steps=4", "trainer.resume=auto", "model.bottom_mlp=[32,8]"
    )
    assert changed.returncode == 2
    (line,) = changed.stderr.strip().splitlines()
    assert line.startswith("error: ") and "model.bottom_mlp" in line and "another run.name" in line
    assert "trainer.max_steps" not in line  # only the keys that cannot apply

    fresh = train(capfd, tmp_path, "run.name=r", "trainer.max_steps=4")  # no resume: would start over in the run
    assert fresh.returncode == 2
    (line,) = fresh.stderr.strip().splitlines()
    assert "trainer.resume=auto" in line and "another run.name" in line
    assert steps(tmp_path / "outputs/r") == ["step_00000002"]


@pytest.mark.slow
def test_a_continuation_with_a_smaller_keep_leaves_the_runs_checkpoints(capfd, tmp_path):
    """keep=1 in the continuation prunes only what the continuation wrote; the change is logged
    and recorded, config.yaml keeps the run's own settings."""
    run = tmp_path / "outputs" / "k"
    first = train(capfd, tmp_path, "run.name=k", "trainer.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep=3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert steps(run) == ["step_00000002", "step_00000004", "step_00000006"]

    more = ("trainer.max_steps=10", "checkpoint.every_steps=2", "checkpoint.keep=1", "trainer.resume=auto")
    cont = train(capfd, tmp_path, "run.name=k", *more)
    assert cont.returncode == 0, cont.stderr[-3000:]
    assert steps(run) == ["step_00000002", "step_00000004", "step_00000006", "step_00000010"]
    log = (run / "train.log").read_text()
    assert "checkpoint.keep: 3 -> 1" in log and "trainer.max_steps: 6 -> 10" in log
    assert "deleting" in log and "step_00000008" in log
    changes = json.loads((run / "continuations.jsonl").read_text())["changes"]
    assert changes == {"checkpoint.keep": [3, 1], "trainer.max_steps": [6, 10]}
    assert "keep: 3" in (run / "config.yaml").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    starts = [(r["step"], r["resumed"]) for r in records if r.get("event") == "start"]
    assert starts == [(0, False), (6, True)]  # each invocation marked where it began
