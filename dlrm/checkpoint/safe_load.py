"""Loading a checkpoint, which is untrusted input. Before DCP reads anything, `open_checkpoint` checks:

- manifest.json is byte-for-byte its canonical JSON and matches its own sha256 (`manifest_sha256`);
- every file the manifest lists (`files`: name -> size, sha256) exists with that size, and, unless
  `checkpoint.verify=false`, that sha256: each rank checks a share of the files (every world-th by
  name), not all of them; `.metadata` is always hashed, by every rank;
- `.metadata` (DCP's pickle) is unpickled from the verified bytes with memo indices bounded and an
  exact (module, name) allowlist of DCP's metadata classes; every entry must be a tensor (DCP would
  `torch.load(weights_only=False)` a non-tensor entry) stored in a listed file, untransformed.
DCP then reads tensors with `torch.load(weights_only=True)`; the loaded step must equal the manifest's.
DCP reshards on load, so a checkpoint written by W ranks with one sharding loads into W' ranks with another.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import pickletools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)

from dlrm.checkpoint.finite import everyones, listed, nonfinite_tensors
from dlrm.checkpoint.layout import METADATA, CheckpointError, another_checkpoint
from dlrm.checkpoint.manifest import check_file, read_manifest
from dlrm.optim.state_moves import fit_to_checkpoint

# --- DCP's .metadata, unpickled with an exact allowlist ----------------------------------------

_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
_DCP_METADATA = "torch.distributed.checkpoint.metadata"


class _MetadataUnpickler(pickle.Unpickler):
    """Admits exactly the (module, name) pairs DCP's metadata of tensors is made of.

    Names are compared whole, so a dotted name (`metadata` + `.os.system`, which pickle would
    resolve attribute by attribute) is refused; BytesStorageMetadata (pickled objects) is refused.
    """

    ALLOWED = {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("collections", "OrderedDict"),
    } | {("torch", dtype) for dtype in _DTYPES}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint of tensors never holds")


def _enum_member(cls: Any, name: Any) -> Any:
    """`getattr(cls, name)` as some Python releases pickle an Enum member, by name (3.11.2, Debian 12's,
    does; 3.11.7 and 3.12 pickle it by value): admitted for DCP's `_MEM_FORMAT_ENCODING` members only."""
    if cls is _MEM_FORMAT_ENCODING and isinstance(name, str) and name in _MEM_FORMAT_ENCODING.__members__:
        return _MEM_FORMAT_ENCODING[name]
    raise pickle.UnpicklingError(f"getattr({getattr(cls, '__name__', '?')}, {name!r}) is not a memory-format member")


def _check_opcodes(data: bytes) -> None:
    """Refuse memo indices beyond the opcodes read so far (the C unpickler would allocate for them)."""
    for count, (opcode, arg, _) in enumerate(pickletools.genops(data), 1):
        memo = ("PUT", "BINPUT", "LONG_BINPUT", "GET", "BINGET", "LONG_BINGET")
        if opcode.name in memo and isinstance(arg, int) and arg > count:
            raise pickle.UnpicklingError(f"{opcode.name} {arg}: a memo index no pickle of this size uses")


def _load_metadata(path: Path, data: bytes, files: dict[str, dict]) -> Metadata:
    """Unpickle and check DCP's metadata (`data`, already verified against the manifest)."""
    file = path / METADATA
    try:
        _check_opcodes(data)
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # untrusted bytes: any failure to parse them is a refusal
        raise CheckpointError(
            f"refusing {file}: {e}; it is not DCP metadata of tensors (corrupt or crafted): {another_checkpoint(path)}"
        ) from None
    bad = _metadata_problem(metadata, path, files)
    if bad:
        raise CheckpointError(f"refusing {file}: {bad}; it was not written by this trainer: {another_checkpoint(path)}")
    return metadata


def _metadata_problem(md: Any, path: Path, files: dict[str, dict]) -> str | None:
    """Why `md` is not the metadata of tensors stored in `files` (None if it is)."""
    if (
        not isinstance(md, Metadata)
        or not isinstance(md.state_dict_metadata, dict)
        or not isinstance(md.storage_data, dict)
    ):
        return "not a DCP Metadata with state_dict_metadata and storage_data"
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(entry, TensorStorageMetadata):
            return f"entry {key!r} is not a tensor"
    if not isinstance(md.storage_meta, (StorageMeta, type(None))) or not isinstance(
        md.planner_data, (dict, type(None))
    ):
        return "storage_meta or planner_data of the wrong type"
    for index, info in md.storage_data.items():
        name, offset, length = (getattr(info, a, None) for a in ("relative_path", "offset", "length"))
        if name not in files or name == METADATA:
            return f"data of {getattr(index, 'fqn', index)!r} is in {name!r}, a file the manifest does not list"
        if not (
            isinstance(offset, int)
            and isinstance(length, int)
            and 0 <= offset
            and 0 <= length
            and offset + length <= files[name]["size"]
        ):
            return f"data of {getattr(index, 'fqn', index)!r} lies outside {name}"
        if getattr(info, "transform_descriptors", None):
            return f"data of {getattr(index, 'fqn', index)!r} needs stream transforms, which this trainer never writes"
    return None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, handed metadata that `open_checkpoint` has verified (it reads no pickle itself)."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        super().__init__(path)
        self.metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("per-rank DCP metadata is not used by this trainer")
        if self.metadata.storage_meta is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id
        return self.metadata


# --- verifying, then loading ------------------------------------------------------------------


def open_checkpoint(path: Path, verify: bool = True, pg: dist.ProcessGroup | None = None) -> tuple[dict, Metadata]:
    """Verify checkpoint `path` (see the module docstring); return its manifest and DCP metadata.

    With a process group, every rank checks the manifest and `.metadata`, each rank a share of the
    data files (stat, and sha256 if `verify`), and all raise the same CheckpointError if any check fails.
    """
    rank, world = (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)
    result: Any = None
    try:
        manifest = read_manifest(path)
        files = manifest["files"]
        check_file(path, METADATA, files[METADATA], hash_it=False)
        data = (path / METADATA).read_bytes()
        if hashlib.sha256(data).hexdigest() != files[METADATA]["sha256"]:
            raise CheckpointError(
                f"checkpoint file {path / METADATA} is corrupt (its sha256 differs from the "
                f"manifest's): {another_checkpoint(path)}"
            )
        metadata = _load_metadata(path, data, files)
        for name in sorted(set(files) - {METADATA})[rank::world]:  # this rank's share; errors are gathered
            check_file(path, name, files[name], hash_it=verify)
        result = (manifest, metadata)
    except CheckpointError as e:
        result = e
    except OSError as e:
        result = CheckpointError(
            f"cannot read checkpoint {path}: {e}; fix its permissions or {another_checkpoint(path)}"
        )
    if pg is not None:
        errors: list[str | None] = [None] * world
        dist.all_gather_object(errors, str(result) if isinstance(result, CheckpointError) else None, group=pg)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise CheckpointError(first)
    if isinstance(result, CheckpointError):
        raise result
    return result


def _fit_optimizer_state(path: Path, manifest: dict, metadata: Metadata, state: dict) -> Callable[[], None]:
    """Key `state["optim"]["state"]` as the checkpoint saved it where tables moved between fused kernels
    and data_parallel.

    Returns:
        What to call after the load (moves the loaded state back into this run's layout).

    Raises:
        CheckpointError: naming the tables whose saved state fits neither layout.
    """
    if "optim" not in state or "progress" not in state:
        return lambda: None
    saved = {k: v.size for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}
    fitted, finish, misfits = fit_to_checkpoint(state["optim"]["state"], saved, state["progress"]["step"])
    if misfits:
        tables = sorted({m.split(".")[-2] for m in misfits})
        planned = {row.get("table"): row.get("sharding_type") for row in manifest.get("sharding_plan") or []}
        saved_as = "; ".join(f"sharding.per_table.{t}={planned.get(t, '?')}" for t in tables)
        raise CheckpointError(
            f"checkpoint {path} holds optimizer state for tables {', '.join(tables)} in a layout this run's "
            f"plan cannot load; resume with their sharding as saved ({saved_as}), then change it at a later resume "
            "in steps that keep the layout"
        )
    state["optim"]["state"] = fitted
    return finish


def load_checkpoint(path: Path, state: dict, verify: bool = True, pg: dist.ProcessGroup | None = None) -> dict:
    """Verify checkpoint `path`, then load it into `state`'s tensors in place (resharding as needed).

    Args:
        path: a checkpoint directory.
        state: nested dicts of tensors, a subset of what was saved; with `progress.step` in it, the
            loaded step must equal the manifest's.
        verify: check every data file's sha256 (sizes are always checked).
        pg: the process group of all ranks; None for one process.

    Returns:
        The checkpoint's manifest.

    Raises:
        CheckpointError: a check failed, the state does not fit this model, or it holds NaN or inf.
    """
    manifest, metadata = open_checkpoint(path, verify, pg)
    finish = _fit_optimizer_state(path, manifest, metadata, state)
    try:
        with warnings.catch_warnings():  # DCP warns on every load without a process group
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, storage_reader=SafeFileSystemReader(path, metadata), process_group=pg, no_dist=pg is None)
    except CheckpointException as e:
        reasons = sorted({str(exc) for exc, _ in e.failures.values()})
        raise CheckpointError(
            f"checkpoint {path} does not fit this run: {'; '.join(reasons)}; "
            "load it with the model and optimizer it was written with"
        ) from None
    finish()
    bad = everyones(nonfinite_tensors(state), pg)
    if bad:  # written before checkpoints were checked, or by another program
        raise CheckpointError(
            f"checkpoint {path} holds NaN or inf in {len(bad)} tensors ({listed(bad)}): it was saved from "
            f"a diverged run; {another_checkpoint(path)}"
        )
    step = state.get("progress", {}).get("step")
    if step is not None and int(step.item()) != manifest["step"]:
        raise CheckpointError(
            f"checkpoint {path} holds step {int(step.item())}, its manifest says {manifest['step']} "
            f"(corrupt; load with checkpoint.verify=true to find the file): {another_checkpoint(path)}"
        )
    return manifest
