"""Distributed checkpoints with torch.distributed.checkpoint (DCP): atomic, kept K, resumable, safe.

Layout of `checkpoint.dir`:
    step_00000040/            a complete checkpoint: DCP shards + `.metadata` + manifest.json
    .step_00000050.partial/   a save in progress (or interrupted): never read, removed by the next save

A checkpoint holds only tensors (model state, optimizer state, the step): loading unpickles no
arbitrary objects. DCP's `.metadata` file is read with an unpickler that admits DCP's own metadata
classes only. DCP reshards on load, so a checkpoint written by W ranks with one sharding loads into
W' ranks with another.
"""

from __future__ import annotations

from dlrm.errors import UserError
import json
import os
import pickle
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from dlrm.config import ModelConfig
from dlrm.core.cadence import Every
from dlrm.io import write_json_atomic

MANIFEST = "manifest.json"
_PREFIX = "step_"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""


def checkpoint_dirname(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def complete_checkpoints(root: Path) -> List[Path]:
    """Complete checkpoints under `root` (a manifest is written last), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(root: Path) -> Optional[Path]:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def model_signature(cfg: ModelConfig) -> dict:
    """What must match for a checkpoint to load into a model: architecture and table shapes."""
    return asdict(cfg)


def signature_differences(saved: dict, current: dict) -> List[str]:
    """Human-readable differences between two model signatures (empty when compatible)."""
    diffs = []
    saved_tables = {t["name"]: t for t in saved.get("tables", [])}
    current_tables = {t["name"]: t for t in current.get("tables", [])}
    for name in sorted(saved_tables.keys() | current_tables.keys()):
        a, b = saved_tables.get(name), current_tables.get(name)
        if a is None or b is None:
            diffs.append(f"table {name}: {'missing in the checkpoint' if a is None else 'not in this model'}")
            continue
        for key in ("rows", "dim", "features"):
            if a[key] != b[key]:
                diffs.append(f"table {name}: {key} {a[key]} in the checkpoint, {b[key]} in this model")
    for key in ("interaction", "dense_in_features", "bottom_mlp", "top_mlp", "dcn_num_layers", "dcn_low_rank_dim"):
        if saved.get(key) != current.get(key) and not (key.startswith("dcn") and current.get("interaction") == "dot"):
            diffs.append(f"model.{key}: {saved.get(key)} in the checkpoint, {current.get(key)} in this model")
    return diffs


def read_manifest(path: Path) -> dict:
    try:
        return json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST}); pick a step_* directory") from None


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only the classes DCP's metadata is made of; anything else is refused."""

    _ALLOWED_MODULES = {
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
        "torch.distributed.checkpoint.planner",
        "torch.distributed.checkpoint.storage",
        "collections",
    }
    _ALLOWED = {("torch", "Size"), ("torch", "float32"), ("torch", "float64"), ("torch", "int64"),
                ("torch", "int32"), ("torch", "float16"), ("torch", "bfloat16"), ("torch", "uint8"),
                ("torch", "int8"), ("torch", "bool"), ("torch", "strided"), ("torch", "contiguous_format"),
                ("torch", "device"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"),
                ("torch", "dtype"), ("torch.serialization", "_get_layout"),
                ("pathlib", "PosixPath")}

    def find_class(self, module: str, name: str) -> Any:
        if module in self._ALLOWED_MODULES or (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise CheckpointError(f"checkpoint metadata refers to {module}.{name}, which a checkpoint never needs; refusing to load it")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with the `.metadata` pickle restricted to DCP's metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        if kwargs.get("rank") is not None:
            raise CheckpointError("per-rank DCP metadata is not used by this trainer")
        with open(Path(self.path) / ".metadata", "rb") as f:
            return _MetadataUnpickler(f).load()


class Checkpointer:
    """Saves and loads one rank's share of a checkpoint; every rank calls every method.

    Args:
        root: the checkpoint directory (shared by all ranks: one filesystem for all nodes).
        keep: complete checkpoints to keep; older ones are deleted after a successful save.
        pg: the process group of all ranks.
        is_main: whether this is rank 0 (it renames, writes the manifest and prunes).
        every: when `maybe_save` saves (default: never; `save` always does).
    """

    def __init__(
        self, root: Path, keep: int, pg: dist.ProcessGroup, is_main: bool, every: Optional[Every] = None
    ) -> None:
        self.root = root
        self.keep = keep
        self.pg = pg
        self.is_main = is_main
        self.every = every or Every(0, at_end=False)

    def maybe_save(
        self, step: int, last: bool, state: Callable[[], dict], manifest: Callable[[], dict]
    ) -> Optional[Path]:
        """Save checkpoint `step` of `state()` if `every` is due (all ranks call it); its directory, or None."""
        if not self.every.due(step, last):
            return None
        return self.save(step, state(), manifest())

    def save(self, step: int, state: dict, manifest: dict) -> Path:
        """Write `state` (nested dicts of tensors) as checkpoint `step`, visible only when complete."""
        final = self.root / checkpoint_dirname(step)
        partial = self.root / f".{checkpoint_dirname(step)}.partial"
        if self.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(".*.partial"):
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier(group=self.pg)
        dcp.save(state, checkpoint_id=str(partial), process_group=self.pg)
        dist.barrier(group=self.pg)
        if self.is_main:
            write_json_atomic(partial / MANIFEST, {**manifest, "step": step})
            if final.exists():  # the same step saved again after a restart
                shutil.rmtree(final)
            os.replace(partial, final)
            for old in complete_checkpoints(self.root)[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier(group=self.pg)
        return final

    def load(self, path: Path, state: dict, signature: dict) -> dict:
        """Load checkpoint `path` into `state`'s tensors in place (resharding as needed).

        Refuses a checkpoint whose model differs from `signature`. Returns its manifest.
        """
        manifest = read_manifest(path)
        diffs = signature_differences(manifest.get("model", {}), signature)
        if diffs:
            raise CheckpointError(f"checkpoint {path} is for another model: " + "; ".join(diffs))
        dcp.load(state, storage_reader=SafeFileSystemReader(path), process_group=self.pg)
        return manifest


def load_unsharded(path: Path, state: dict) -> None:
    """Load checkpoint `path` into full-size tensors in one process (no process group): export."""
    dcp.load(state, storage_reader=SafeFileSystemReader(path), no_dist=True)


def step_tensor(step: int) -> torch.Tensor:
    return torch.tensor([step], dtype=torch.int64)
