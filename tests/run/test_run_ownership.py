"""Runs own their directory: a second training of the same run is refused while the first holds its
lock, a fresh run never starts over another run's config.yaml or checkpoints (nor rewrites Hydra's
`.hydra/` record of it), a resume from an older step never replaces the later checkpoints of an
earlier invocation. Each refusal is one line, exit 2,
before any training (dlrm.train.main in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dlrm.run.records import LOCK, RunInUseError, lock_run_dir
from tests.helpers.cli import assert_one_error, main_in_process

RUN = ("model=tiny", "data.global_batch_size=64", "trainer.max_steps=2", "trainer.progress=none")


def _complete(root: Path, step: int) -> Path:
    """A directory that counts as a complete checkpoint (its manifest exists)."""
    ckpt = root / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "manifest.json").write_text("{}")
    return ckpt


def test_a_held_run_directory_is_refused_naming_the_holder(tmp_path):
    fd = lock_run_dir(tmp_path)
    try:
        with pytest.raises(RunInUseError, match=rf"{tmp_path} is in use by another training \(pid {os.getpid()} on "):
            lock_run_dir(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_run_dir(tmp_path))  # free again once the holder is gone


def test_the_lock_does_not_follow_a_planted_symlink(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).symlink_to(target)
    with pytest.raises(OSError):
        lock_run_dir(run)
    assert target.read_text() == "keep me"


def _hydra_records(run: Path) -> dict[str, str]:
    """The first run's `.hydra/` (Hydra's record of its latest invocation), which a refusal must keep."""
    (run / ".hydra").mkdir(parents=True)
    records = {name: f"theirs: {name}\n" for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    for name, text in records.items():
        (run / ".hydra" / name).write_text(text)
    return records


def _kept(run: Path, records: dict[str, str]) -> bool:
    return {p.name: p.read_text() for p in (run / ".hydra").iterdir()} == records


def test_a_second_training_of_a_running_run_is_one_error(monkeypatch, capsys, tmp_path):
    records = _hydra_records(tmp_path)
    fd = lock_run_dir(tmp_path)  # the first training, still running
    try:
        result = main_in_process(monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path}")
    finally:
        os.close(fd)
    assert_one_error(*result, str(tmp_path), "in use by another training", "run.name")
    assert not (tmp_path / "config.yaml").exists() and _kept(tmp_path, records)


def test_a_fresh_run_into_another_runs_directory_is_one_error(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("theirs: 1\n")
    records = _hydra_records(tmp_path)
    result = main_in_process(monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path}")
    assert_one_error(*result, str(tmp_path / "config.yaml"), "trainer.resume=auto", "run.name")
    assert (tmp_path / "config.yaml").read_text() == "theirs: 1\n" and _kept(tmp_path, records)


def test_a_fresh_run_over_checkpoints_is_one_error(monkeypatch, capsys, tmp_path):
    ckpt = _complete(tmp_path / "ckpts", 4)
    result = main_in_process(
        monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path / 'run'}", f"checkpoint.dir={ckpt.parent}"
    )
    assert_one_error(*result, str(ckpt), "trainer.resume=auto")


def test_a_resume_from_an_older_step_over_later_checkpoints_is_one_error(monkeypatch, capsys, tmp_path):
    root = tmp_path / "run" / "checkpoints"
    older, later = _complete(root, 4), _complete(root, 8)
    args = (*RUN, f"hydra.run.dir={tmp_path / 'run'}", f"trainer.resume={older}")
    assert_one_error(*main_in_process(monkeypatch, capsys, *args), "after step 4", str(later), "trainer.resume=auto")
    assert (later / "manifest.json").read_text() == "{}"


def test_a_checkpoint_directory_in_use_by_another_run_is_one_error(monkeypatch, capsys, tmp_path):
    """Two runs sharing checkpoint.dir would write and prune each other's checkpoints: the second is
    refused before it trains, naming the directory and the holder."""
    ckpts = tmp_path / "shared_ckpts"
    fd = lock_run_dir(ckpts)  # the first run's rank 0, still training into it
    try:
        result = main_in_process(
            monkeypatch, capsys, *RUN, f"hydra.run.dir={tmp_path / 'b'}", f"checkpoint.dir={ckpts}"
        )
    finally:
        os.close(fd)
    assert_one_error(*result, str(ckpts), "in use by another training", f"pid {os.getpid()}", "checkpoint.dir")
    assert not any(ckpts.glob("step_*")) and not (tmp_path / "b" / "config.yaml").exists()
