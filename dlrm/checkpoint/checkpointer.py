"""The `Checkpointer`: saves (atomic, finite, kept K; in the background with `dcp.async_save`) and loads
one rank's share of a checkpoint."""

from __future__ import annotations

import io
import logging
import os
import shutil
import threading
from collections.abc import Generator
from contextlib import contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from dlrm.checkpoint.finite import everyones, listed, nonfinite_tensors
from dlrm.checkpoint.layout import (
    MANIFEST,
    METADATA,
    CheckpointError,
    checkpoint_dirname,
    complete_checkpoints,
    latest_checkpoint,
)
from dlrm.checkpoint.manifest import file_digest, read_manifest, signature_differences, write_manifest
from dlrm.checkpoint.safe_load import load_checkpoint
from dlrm.common.cadence import Every
from dlrm.common.io import DiskFullError, disk_full_is_user_error, publish_dir

log = logging.getLogger(__name__)


class NonFiniteCheckpointError(CheckpointError):
    """The model to save holds NaN or inf values: it is not saved (every rank raises it alike)."""


def _tensor_leaves_only(state: Any, prefix: str = "") -> None:
    """Refuse to save a non-tensor (DCP would pickle it, and loading refuses pickled objects)."""
    if isinstance(state, dict):
        for key, value in state.items():
            _tensor_leaves_only(value, f"{prefix}{key}.")
    elif not isinstance(state, torch.Tensor):  # ShardedTensor and DTensor are Tensors too
        raise TypeError(f"checkpoint state {prefix[:-1]} is a {type(state).__name__}, not a tensor")


# DCP writer threads per rank (torch's default). Each thread holds a clone of the item it writes and a malloc
# arena; a background save hides the write's time but not its memory (docs/design/checkpoint-saving.md).
WRITER_THREADS = 1
BACKGROUND_TIMEOUT_S = 3600.0  # a background save's collectives (its own Gloo group) wait this long for the ranks


class _FileSystem(FileSystem):
    """DCP's file system that hashes each file it wrote once closed and notes the writers' exceptions.

    `digests` maps each file name written to {size, sha256}, hashed on the thread that wrote it.
    An exception on the calling thread (`caller`) propagates; on another writer thread it is noted in
    `failures` and not raised (torch would drop it), and after any failure no new file is created.
    """

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict] = {}  # file name -> {size, sha256}; the metadata's .tmp too
        self.failures: list[Exception] = []
        self.caller: int | None = None  # the thread that calls write_data
        self.writers: set[int] = set()  # the threads that opened a stream
        self.stopped = False  # after a failure: no new file is created

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        self.writers.add(threading.get_ident())
        caller = threading.get_ident() == self.caller
        if self.stopped and "w" in mode:  # the save has failed: no new file
            if caller:
                raise self.failures[0]  # the failure that stopped it (e.g. ENOSPC on another thread)
            with suppress(Exception):  # another thread's item goes nowhere (raising there prints a traceback)
                yield io.BytesIO()
            return
        opened = False
        try:
            with super().create_stream(path, mode) as stream:
                opened = True
                yield stream
            if "w" in mode:
                self.digests[Path(path).name] = file_digest(Path(path))
        except Exception as e:
            self.failures.append(e)
            self.stopped = True
            if caller:
                raise
            if not opened:  # the file could not be created: the item goes nowhere, write_data raises e
                with suppress(Exception):
                    yield io.BytesIO()

    def join_writers(self, timeout_s: float = 120.0) -> None:
        """Stop, and wait up to `timeout_s` for each of this save's other writer threads.

        A stopped thread finishes the file it has open and creates no other, so no file appears after
        the caller removes a failed save's partial checkpoint.
        """
        self.stopped = True
        for thread in threading.enumerate():
            if thread.ident in self.writers and thread.ident != self.caller:
                thread.join(timeout_s)


class RankWriter(FileSystemWriter):
    """DCP's file writer: one file per tensor item (each staged clone freed once written), and the digest
    of each file this rank wrote.

    Args:
        path: the checkpoint directory being written.
        threads: writer threads (default `WRITER_THREADS`).

    After `write_data`, `digests` maps each file of this rank's WriteResults
    (`storage_data.relative_path`) to {size, sha256}, or None for a file that was not hashed; a
    writer thread's failure is raised there.
    """

    def __init__(self, path: Path, threads: int | None = None) -> None:
        super().__init__(str(path), single_file_per_rank=False, thread_count=threads or WRITER_THREADS)
        self.fs = _FileSystem()
        self.digests: dict[str, dict | None] = {}

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        self.fs.caller = threading.get_ident()
        try:
            done = super().write_data(plan, planner)
            results = done.wait()
        except BaseException:
            self.fs.join_writers()
            raise
        if self.fs.failures:  # a writer thread's, which torch dropped
            raise self.fs.failures[0]
        if len(results) != len(plan.items):
            raise RuntimeError(f"DCP wrote {len(results)} of {len(plan.items)} checkpoint items to {self.path}")
        self.digests = {name: self.fs.digests.get(name) for name in (r.storage_data.relative_path for r in results)}
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Rank 0 writes `.metadata`; `metadata.storage_data` is filled where torch left it empty.

        So the Metadata that `dcp.save` returns lists the files on every torch version.
        """
        super().finish(metadata, results)
        if metadata.storage_data is None:
            metadata.storage_data = {wr.index: wr.storage_data for wr_list in results for wr in wr_list}


def storage_writer(path: Path) -> RankWriter:
    """The writer of one save to `path` (replaceable, to inject write failures)."""
    return RankWriter(path)


def saved_files(metadata: Metadata) -> list[str]:
    """The sorted file names a checkpoint's DCP `metadata` lists: each item's file and `.metadata`.

    Other files in the directory are not listed.
    """
    return sorted({info.relative_path for info in metadata.storage_data.values()} | {METADATA})


class Checkpointer:
    """Saves and loads one rank's share of a checkpoint; every rank calls every method.

    Args:
        root: the checkpoint directory (shared by all ranks: one filesystem for all nodes).
        keep: complete checkpoints to keep; older ones that this Checkpointer wrote are deleted after
            a successful save (an earlier invocation's, e.g. the run a continuation resumes, never).
        pg: the process group of all ranks.
        is_main: whether this is rank 0 (it renames, writes the manifest and prunes).
        every: when `due` says a save is due (default: never).
        background: let `save(..., background=True)` write in the background (`dcp.async_save`); it makes
            a Gloo process group of its own here, so every rank must construct it at the same point.
    """

    def __init__(
        self,
        root: Path,
        keep: int,
        pg: dist.ProcessGroup,
        is_main: bool,
        every: Every | None = None,
        background: bool = False,
    ) -> None:
        self.root = root
        self.keep = keep
        self.pg = pg
        self.is_main = is_main
        self.every = every or Every(0, at_end=False)
        self.written: set[Path] = set()  # by this Checkpointer: the only ones retention deletes
        # A background save's collectives run on its writer thread while training runs the training
        # group's: a group of their own (Gloo: async_save needs a CPU backend), never interleaved.
        self.background_pg: dist.ProcessGroup | None = None
        if background:
            group = dist.new_group(backend="gloo", timeout=timedelta(seconds=BACKGROUND_TIMEOUT_S))
            assert isinstance(group, dist.ProcessGroup)  # every rank is a member
            self.background_pg = group
        self._pending: threading.Thread | None = None
        self._pending_error: BaseException | None = None

    def due(self, step: int, last: bool) -> bool:
        """Whether a checkpoint is due after `step` (`every`; `last`: the run's last step)."""
        return self.every.due(step, last)

    def save(self, step: int, state: dict, manifest: dict, background: bool = False) -> Path:
        """Write `state` as checkpoint `step`, visible only when complete.

        Rank 0 writes the manifest (`manifest` plus the step and every file's size and sha256) and
        renames the directory into place. A save still in the background is waited for first.

        Args:
            step: the training step; names the directory.
            state: nested dicts of tensors (this rank's share).
            manifest: the run's facts to record (model signature, optimizers, ...).
            background: with the constructor's `background`, return once `state` is staged in host
                memory; the write completes on a thread and `wait` raises what failed.

        Returns:
            The checkpoint's final directory.

        Raises:
            TypeError: a leaf of `state` is not a tensor.
            NonFiniteCheckpointError: a tensor on any rank holds NaN or inf.
            CheckpointError: the directory holds another invocation's checkpoint of this step.
            DiskFullError: the disk filled up (the partial checkpoint is removed).
        """
        self.wait()
        _tensor_leaves_only(state)
        bad = everyones(nonfinite_tensors(state), self.pg)
        if bad:  # a diverged model is never saved, so every complete checkpoint is a good one
            latest = latest_checkpoint(self.root)
            raise NonFiniteCheckpointError(
                f"step {step} not checkpointed: {len(bad)} tensors hold NaN or inf ({listed(bad)}), the "
                f"training diverged; last good checkpoint: {latest or 'none'}. Lower optim.embedding.lr / "
                "optim.dense.lr and resume from it (trainer.resume=auto), or check the data for NaN/inf"
            )
        final = self.root / checkpoint_dirname(step)
        partial = self.root / f".{checkpoint_dirname(step)}.partial"
        if (final / MANIFEST).is_file() and final not in self.written:  # every rank sees it: all refuse
            raise CheckpointError(
                f"{final} is another invocation's checkpoint: not replaced. Resume from the newest checkpoint "
                "(trainer.resume=auto), or write this run's checkpoints elsewhere (checkpoint.dir)"
            )
        latest = latest_checkpoint(self.root)
        keep = f"checkpoint step {step} not saved, the last good one kept: {latest or 'none'}"
        if background and self.background_pg is not None:
            self._start_background(step, state, manifest, partial, final, (latest, keep))
            return final
        try:
            with disk_full_is_user_error(self.root, f"checkpoint step {step}", keep, like=latest):
                self._prepare()
                writer = storage_writer(partial)
                metadata = dcp.save(state, storage_writer=writer, process_group=self.pg)
                self._complete(step, metadata, writer, manifest, partial, final, self.pg)
        except DiskFullError:
            if self.is_main:  # its space back; never a complete checkpoint
                shutil.rmtree(partial, ignore_errors=True)
            raise
        return final

    def _start_background(
        self, step: int, state: dict, manifest: dict, partial: Path, final: Path, latest_keep: tuple
    ) -> None:
        """Stage `state` on the host and write it on `dcp.async_save`'s thread; a thread of ours then
        completes the checkpoint (`_complete` on `background_pg`) and notes any failure for `wait`."""
        pg = self.background_pg
        assert pg is not None
        self._prepare()
        writer = storage_writer(partial)
        upload = dcp.async_save(state, storage_writer=writer, process_group=pg)  # returns once staged
        latest, keep = latest_keep

        def complete() -> None:
            try:
                with disk_full_is_user_error(self.root, f"checkpoint step {step}", keep, like=latest):
                    metadata = upload.result()  # type: ignore[union-attr]  # a Future without a stager of ours
                    self._complete(step, metadata, writer, manifest, partial, final, pg)
            except BaseException as e:  # noqa: BLE001  # raised by `wait`, on the training thread
                if self.is_main:
                    shutil.rmtree(partial, ignore_errors=True)
                self._pending_error = e

        self._pending = threading.Thread(target=complete, name=f"checkpoint-step-{step}", daemon=True)
        self._pending.start()

    @property
    def in_flight(self) -> bool:
        """Whether a background save is still being written."""
        return self._pending is not None and self._pending.is_alive()

    def wait(self) -> None:
        """Return once the background save (if any) is complete; raise what made it fail. Every rank
        calls it at the same point (a clean stop, the run's end, before the next save)."""
        if self._pending is None:
            return
        self._pending.join()
        self._pending, error, self._pending_error = None, self._pending_error, None
        if error is not None:
            raise error

    def _prepare(self) -> None:
        """Before a save: rank 0 makes the directory and removes stale partial ones; all ranks wait for it."""
        if self.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(".*.partial"):
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier(group=self.pg)

    def _complete(
        self,
        step: int,
        metadata: Metadata,
        writer: RankWriter,
        manifest: dict,
        partial: Path,
        final: Path,
        pg: dist.ProcessGroup,
    ) -> None:
        """After DCP wrote `partial` (`metadata`: what it returned): the ranks' digests gathered over
        `pg`, rank 0's manifest and rename."""
        names = saved_files(metadata)
        # dcp.save returns once rank 0 has written .metadata, after every rank's write_data;
        # a rank that sees no .metadata, or another one (rank 0's holds a new save_id), is on another filesystem
        seen = file_digest(partial / METADATA) if (partial / METADATA).is_file() else None
        mine = dict(writer.digests)  # this rank's own files, hashed as they were written
        if dist.get_rank(pg) == 0:  # DCP's coordinator: it wrote .metadata
            mine[METADATA] = seen
        shares: list[Any] = [None] * dist.get_world_size(pg)
        dist.all_gather_object(shares, (mine, seen), group=pg)
        files = {name: digest for share, _ in shares for name, digest in share.items() if digest is not None}
        unseen = sorted(set(names) - set(files))
        blind = [str(rank) for rank, (_, theirs) in enumerate(shares) if theirs != files.get(METADATA)]
        if unseen or blind:  # every rank holds every share: all raise alike
            what = f"files DCP wrote are missing ({listed(unseen)})" if unseen else f"ranks {listed(blind)} miss"
            raise RuntimeError(
                f"{what} in {partial}{'' if unseen else ': the .metadata rank 0 wrote'}: is checkpoint.dir on a "
                "shared filesystem?"
            )
        if self.is_main:
            write_manifest(partial, {**manifest, "step": step, "files": files})
            self._publish(partial, final)
        dist.barrier(group=pg)

    def _publish(self, partial: Path, final: Path) -> None:
        """Rank 0: rename the complete `partial` to `final`, then delete this Checkpointer's checkpoints
        beyond `keep`."""
        if final.exists():  # an incomplete one (no manifest), or this invocation's own
            shutil.rmtree(final)
        publish_dir(partial, final, flush_files=False)  # DCP's writer flushed the data files, the manifest is atomic
        self.written.add(final)
        for old in complete_checkpoints(self.root)[: -self.keep]:
            if old in self.written:  # never one that an earlier invocation of the run wrote
                log.info(f"checkpoint.keep={self.keep}: deleting {old}")
                shutil.rmtree(old, ignore_errors=True)

    def load(self, path: Path, state: dict, expected: dict, verify: bool = True) -> dict:
        """Load checkpoint `path` into `state`'s tensors in place (resharding as needed).

        Args:
            path: a complete checkpoint directory.
            state: nested dicts of this rank's tensors, filled in place.
            expected: {"model": model signature, "optim": {section: name}}; "optim" is compared only
                when given.
            verify: check every file against the manifest's sha256.

        Returns:
            The checkpoint's manifest.

        Raises:
            CheckpointError: the manifest's model or optimizers differ from `expected` (each difference
                named), or the files fail to load.
        """
        manifest = read_manifest(path)
        diffs = signature_differences(manifest.get("model", {}), expected["model"])
        if diffs:
            raise CheckpointError(f"checkpoint {path} is for another model: " + "; ".join(diffs))
        if "optim" in expected and manifest.get("optim") != expected["optim"]:
            saved, current = manifest.get("optim") or {}, expected["optim"]
            diffs = [
                f"optim.{k}.name: {saved.get(k)} in the checkpoint, {current[k]} in this run"
                for k in sorted(current)
                if saved.get(k) != current[k]
            ]
            raise CheckpointError(
                f"checkpoint {path} was written with other optimizers ({'; '.join(diffs)}); their "
                "state cannot carry over: resume with the same optim, or start a new run"
            )
        return load_checkpoint(path, state, verify, self.pg)
