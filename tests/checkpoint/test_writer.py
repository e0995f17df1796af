"""The checkpointer's DCP writer (dlrm.checkpoint.checkpointer.storage_writer): it frees each tensor once
written, hashes the files it wrote, writes on WRITER_THREADS threads (or more, given), and a failure in
one of those threads fails the save (torch's own writer drops it).

DCP clones a view whose storage is larger than itself (TorchRec's fused tables are views of one
buffer) and serialises the clone with torch.save. Counted here: how many of those clones are alive
at once while a state dict of 8 such views is saved, without a process group (DCP's no-dist path).
"""

from __future__ import annotations

import errno
import gc
import threading
import weakref

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata

from dlrm.checkpoint import METADATA, file_digest
from dlrm.checkpoint.checkpointer import WRITER_THREADS, RankWriter, storage_writer
from dlrm.common.io import disk_full_in

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


def test_ours_keeps_one_clone_per_thread(tmp_path, monkeypatch):
    assert most_alive_while_saving(storage_writer(tmp_path / "ours"), monkeypatch) <= WRITER_THREADS + 1


def test_torchs_single_file_writer_still_keeps_them_all(tmp_path, monkeypatch):
    """pytorch/pytorch#195982. When this fails, torch has fixed it: storage_writer can go back to
    DCP's default (one file per rank) and this test can go."""
    kept = most_alive_while_saving(FileSystemWriter(str(tmp_path / "default")), monkeypatch)
    if kept <= 2:
        pytest.fail(f"torch's writer now keeps {kept} clones at once: drop the workaround in storage_writer")
    assert kept == VIEWS


def test_the_writer_digests_the_files_it_wrote_on_its_threads(tmp_path):
    writer = RankWriter(tmp_path, threads=2)  # a file on each thread
    assert storage_writer(tmp_path).thread_count == WRITER_THREADS and not writer.single_file_per_rank
    dcp.save({f"t{i}": torch.full((5,), float(i)) for i in range(VIEWS)}, storage_writer=writer, no_dist=True)
    on_disk = {p.name: file_digest(p) for p in tmp_path.iterdir() if p.name != METADATA}
    assert writer.digests == on_disk and len(on_disk) == VIEWS


def save_failing_off_the_main_thread(writer, monkeypatch) -> Metadata:
    """dcp.save of 8 tensors where every torch.save on a writer thread other than the main one fails with
    ENOSPC; the main thread's first torch.save waits until one has failed, so the other threads take items."""
    failed = threading.Event()
    real_save = torch.save

    def save(obj, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            failed.set()
            raise OSError(errno.ENOSPC, "No space left on device")
        failed.wait(timeout=60)
        return real_save(obj, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    return dcp.save({f"t{i}": torch.full((5,), float(i)) for i in range(VIEWS)}, storage_writer=writer, no_dist=True)


def test_a_writer_thread_s_failure_fails_the_save(tmp_path, monkeypatch):
    unhandled = []  # what a thread would print as a traceback
    monkeypatch.setattr(threading, "excepthook", unhandled.append)
    with pytest.raises(BaseException) as caught:  # DCP's CheckpointException is a BaseException
        save_failing_off_the_main_thread(RankWriter(tmp_path, threads=2), monkeypatch)
    assert disk_full_in(caught.value) is not None, caught.value  # so it is the one-line DiskFullError
    assert not unhandled, unhandled


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_torchs_writer_threads_still_drop_their_failures(tmp_path, monkeypatch):
    """When this fails, torch's writer threads report their exceptions: RankWriter's `_FileSystem`
    (which notes them) can go."""
    writer = FileSystemWriter(str(tmp_path), single_file_per_rank=False, thread_count=2)
    save_failing_off_the_main_thread(writer, monkeypatch)  # no exception: the save "succeeded"
    written = FileSystemReader(str(tmp_path)).read_metadata()  # what dcp.save returns lacks it on torch 2.11
    assert len(written.storage_data) < VIEWS  # without the items of the failed threads
