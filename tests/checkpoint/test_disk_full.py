"""A full disk is one `error:` line naming the path, exit 2, not an OSError traceback: while DCP writes
a checkpoint (the last good checkpoint kept, the partial one removed), and while summary.json is
written. The full disk is injected (OSError ENOSPC from the checkpoint's storage writer or the summary's
writer, in a run of `dlrm.train` in the test process), and, where the tests run as root, real: a small
tmpfs filled up."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from torch.distributed.checkpoint import FileSystemWriter

from dlrm.checkpoint import checkpointer
from dlrm.trainer import reporter
from tests.helpers.cli import assert_one_error, train_in_process

RUN = ("model=tiny", "data.global_batch_size=64", "data.eval_batches=1", "trainer.progress=none")


def _full(path) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


class _FullWriter(FileSystemWriter):
    def write_data(self, plan, planner):
        raise _full(self.path)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_good_one(tmp_path, monkeypatch, capfd):
    real, calls = checkpointer.storage_writer, []

    def writer(path):  # the second save meets a full disk
        calls.append(path)
        return real(path) if len(calls) == 1 else _FullWriter(path)

    monkeypatch.setattr(checkpointer, "storage_writer", writer)
    run = tmp_path / "run"
    code, out, err = train_in_process(
        capfd, *RUN, "trainer.max_steps=2", "checkpoint.every_steps=1", f"hydra.run.dir={run}"
    )
    good = run / "checkpoints" / "step_00000001"
    line = assert_one_error(code, out, err, str(run / "checkpoints"), "No space left")
    assert f"the last good one kept: {good}" in line
    assert (good / "manifest.json").is_file() and [p.name for p in (run / "checkpoints").iterdir()] == [good.name]


def test_a_full_disk_while_writing_the_summary_is_one_line(tmp_path, monkeypatch, capfd):
    def full(path, data):
        raise _full(path)

    monkeypatch.setattr(reporter, "write_json_atomic", full)
    run = tmp_path / "run"
    code, out, err = train_in_process(capfd, *RUN, "trainer.max_steps=1", f"hydra.run.dir={run}")
    assert_one_error(code, out, err, str(run / "summary.json"), "No space left")
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _blocks(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (root only: mounting needs it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "a real full disk needs a tmpfs mount, and mounting needs root; the injected ENOSPC tests cover the rest"
        )
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
def test_a_real_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_good_one(small_disk, capfd):
    """The same 2-step run twice on a tmpfs, checkpointing every step: the first measures what the
    run writes; the second finds the disk filled so that only half of its second checkpoint fits.
    It ends in one line naming the checkpoint directory and the space needed, its step-1 checkpoint
    complete, no partial checkpoint and no summary.json left."""
    steps = ("trainer.max_steps=2", "checkpoint.every_steps=1")
    first = small_disk / "first"
    base = _used(small_disk)
    code, _, err = train_in_process(capfd, *RUN, *steps, f"hydra.run.dir={first}")
    assert code == 0, err[-3000:]
    needs = _used(small_disk) - base - _blocks(first / "checkpoints" / "step_00000002") // 2
    shutil.rmtree(first)
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "ballast").write_bytes(b"\0" * (free - needs))
    run = small_disk / "run"
    code, out, err = train_in_process(capfd, *RUN, *steps, f"hydra.run.dir={run}")
    good = run / "checkpoints" / "step_00000001"
    line = assert_one_error(code, out, err, str(run / "checkpoints"), "No space left")
    assert f"the last good one kept: {good}" in line and f"MiB (as {good} took)" in line, line
    assert (good / "manifest.json").is_file() and [p.name for p in (run / "checkpoints").iterdir()] == [good.name]
    assert not (run / "summary.json").exists()
