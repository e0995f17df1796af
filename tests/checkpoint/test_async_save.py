"""checkpoint.async_save: a background save holds the state of the step it was asked for (staged on the
host before `save` returns), becomes a complete checkpoint only when written, never runs beside another,
and a failure reaches the training thread at `wait`."""

from __future__ import annotations

import errno
import threading

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from dlrm.checkpoint import Checkpointer, checkpointer, latest_checkpoint, read_manifest
from dlrm.checkpoint.checkpointer import RankWriter
from dlrm.common.io import DiskFullError


class HeldWriter(RankWriter):
    """Our writer, held before it writes until `release` is set."""

    release = threading.Event()

    def write_data(self, plan, planner):
        assert self.release.wait(timeout=60)
        return super().write_data(plan, planner)


@pytest.fixture
def held(monkeypatch):
    HeldWriter.release = threading.Event()
    monkeypatch.setattr(checkpointer, "storage_writer", HeldWriter)
    yield HeldWriter.release
    HeldWriter.release.set()


def _state() -> dict:
    return {"model": {"table": torch.arange(4000, dtype=torch.float32).reshape(1000, 4)}, "step": torch.tensor(3)}


def test_the_background_save_holds_the_step_it_was_asked_for(tmp_path, group, held):
    ck = Checkpointer(tmp_path, 2, group, True, background=True)
    state = _state()
    saved = {k: v.clone() for k, v in state["model"].items()}
    path = ck.save(3, state, {"model": {}}, background=True)
    assert ck.in_flight and not path.exists() and latest_checkpoint(tmp_path) is None  # not complete yet
    state["model"]["table"].add_(1.0)  # training goes on while it is written
    held.set()
    ck.wait()
    assert not ck.in_flight and latest_checkpoint(tmp_path) == path and read_manifest(path)["step"] == 3
    loaded = {"model": {"table": torch.zeros(1000, 4)}, "step": torch.tensor(0)}
    ck.load(path, loaded, {"model": {}})
    assert torch.equal(loaded["model"]["table"], saved["table"]) and loaded["step"].item() == 3


def test_a_save_waits_for_the_one_in_flight(tmp_path, group, held):
    ck = Checkpointer(tmp_path, 3, group, True, background=True)
    first = ck.save(1, _state(), {"model": {}}, background=True)
    threading.Timer(0.3, held.set).start()
    second = ck.save(2, _state(), {"model": {}})  # synchronous: returns complete, after the first
    assert (first / "manifest.json").is_file() and (second / "manifest.json").is_file()
    assert latest_checkpoint(tmp_path) == second


def test_a_background_failure_is_raised_at_wait_and_leaves_no_partial(tmp_path, group, monkeypatch):
    class FullWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    ck = Checkpointer(tmp_path, 2, group, True, background=True)
    ck.save(1, _state(), {"model": {}})  # a good one first
    monkeypatch.setattr(checkpointer, "storage_writer", FullWriter)
    ck.save(2, _state(), {"model": {}}, background=True)
    with pytest.raises(DiskFullError, match="step 2"):
        ck.wait()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    assert not list(tmp_path.glob(".*.partial"))
    ck.wait()  # raised once
