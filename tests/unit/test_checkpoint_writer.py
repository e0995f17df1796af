"""The checkpointer's DCP writer frees each tensor once written (dlrm.checkpoint.checkpointer.storage_writer).

DCP clones a view whose storage is larger than itself (TorchRec's fused tables are views of one
buffer) and serialises the clone with torch.save. Counted here: how many of those clones are alive
at once while a state dict of 8 such views is saved, without a process group (DCP's no-dist path).
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from dlrm.checkpoint.checkpointer import storage_writer

VIEWS = 8
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # no_dist=True says so


def most_alive_while_saving(writer, monkeypatch) -> int:
    """The largest number of saved tensors still alive at any torch.save during dcp.save."""
    base = torch.arange(VIEWS * 4096, dtype=torch.float32)
    state = {f"t{i}": base[i * 4096 : (i + 1) * 4096] for i in range(VIEWS)}  # views of one buffer
    refs: list[weakref.ref] = []
    most = [0]
    real_save = torch.save

    def tracking_save(obj, *args, **kwargs):
        if isinstance(obj, torch.Tensor) and obj.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            refs.append(weakref.ref(obj))  # a clone DCP made
        gc.collect()
        most[0] = max(most[0], sum(r() is not None for r in refs))
        return real_save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, "save", tracking_save)
    dcp.save(state, storage_writer=writer, no_dist=True)
    return most[0]


def test_ours_keeps_one_clone_at_a_time(tmp_path, monkeypatch):
    assert most_alive_while_saving(storage_writer(tmp_path / "ours"), monkeypatch) <= 2


def test_torchs_single_file_writer_still_keeps_them_all(tmp_path, monkeypatch):
    """pytorch/pytorch#195982. When this fails, torch has fixed it: storage_writer can go back to
    DCP's default (one file per rank) and this test can go."""
    kept = most_alive_while_saving(FileSystemWriter(str(tmp_path / "default")), monkeypatch)
    if kept <= 2:
        pytest.fail(f"torch's writer now keeps {kept} clones at once: drop the workaround in storage_writer")
    assert kept == VIEWS
