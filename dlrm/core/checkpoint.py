"""Distributed checkpoints with torch.distributed.checkpoint (DCP): atomic, kept K, resumable, verified.

Layout of `checkpoint.dir`:
    step_00000040/            a complete checkpoint: DCP shards (*.distcp) + `.metadata` + manifest.json
    .step_00000050.partial/   a save in progress (or interrupted): never read, removed by the next save

A checkpoint is untrusted input. Before DCP reads anything, `open_checkpoint` checks:
- manifest.json is byte-for-byte its canonical JSON and matches its own sha256 (`manifest_sha256`);
- every file the manifest lists (`files`: name -> size, sha256) exists with that size, and, unless
  `checkpoint.verify=false`, that sha256 (the ranks share the hashing); `.metadata` is always hashed;
- `.metadata` (DCP's pickle) is unpickled from the verified bytes with memo indices bounded and an
  exact (module, name) allowlist of DCP's metadata classes; every entry must be a tensor (DCP would
  `torch.load(weights_only=False)` a non-tensor entry) stored in a listed file, untransformed.
DCP then reads tensors with `torch.load(weights_only=True)`; the loaded step must equal the manifest's.
DCP reshards on load, so a checkpoint written by W ranks with one sharding loads into W' ranks with another.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import pickletools
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from dlrm.config import ModelConfig
from dlrm.core.cadence import Every
from dlrm.core.model import local_pieces
from dlrm.core.optim_state import fit_to_checkpoint
from dlrm.errors import UserError
from dlrm.io import UnreadableFileError, parse_json, read_bounded, write_atomic

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
METADATA = ".metadata"
_PREFIX = "step_"
MANIFEST_LIMIT = 64 << 20  # a file list with digests: kilobytes per rank


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""

    same_on_all_ranks = True  # every rank checks the same checkpoint files and manifest


class NonFiniteCheckpointError(CheckpointError):
    """The model to save holds NaN or inf values: it is not saved (every rank raises it alike)."""


def checkpoint_dirname(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root` (a manifest is written last), oldest first."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.name.startswith(_PREFIX) and p.name[len(_PREFIX) :].isdigit() and (p / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def model_signature(cfg: ModelConfig) -> dict:
    """What must match for a checkpoint to load into a model: architecture and table shapes."""
    return asdict(cfg)


def signature_differences(saved: dict, current: dict) -> list[str]:
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


def _another(path: Path) -> str:
    """The fix for a damaged checkpoint: the newest other complete checkpoint beside it, if any."""
    others = [p for p in complete_checkpoints(path.parent) if p.name != path.name]
    if others:
        return f"use another checkpoint, e.g. trainer.resume={others[-1]}"
    return "use another checkpoint, or train again without trainer.resume"


# --- manifest: canonical JSON carrying its own checksum ---------------------------------------


def _canonical(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write `manifest` (with its sha256 added) to directory/manifest.json, atomically."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    write_atomic(
        directory / MANIFEST, _canonical({**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()})
    )


def read_manifest(path: Path) -> dict:
    """The verified manifest of checkpoint `path`; CheckpointError if it is missing or altered."""
    file = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist or is not a directory; "
            "give a step_* directory under checkpoint.dir (or trainer.resume=auto)"
        )
    try:
        data = read_bounded(file, MANIFEST_LIMIT)
    except UnreadableFileError as e:
        raise CheckpointError(f"{e}; the checkpoint cannot be trusted: {_another(path)}") from None
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is not a complete checkpoint: {file} is missing (an interrupted save "
            f"leaves none); pick a step_* directory that has one: {_another(path)}"
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read {file}: {e.strerror}; fix its permissions or {_another(path)}") from None
    damaged = f"{file} is damaged ({{}}); the checkpoint cannot be trusted: {_another(path)}"
    try:
        manifest = parse_json(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError too
        raise CheckpointError(damaged.format(f"not JSON: {e}")) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("manifest_sha256"), str):
        raise CheckpointError(damaged.format("no manifest_sha256: corrupt, or written by an older version"))
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if _canonical(manifest) != data or hashlib.sha256(_canonical(body)).hexdigest() != manifest["manifest_sha256"]:
        raise CheckpointError(damaged.format("its content does not match its manifest_sha256"))
    files = manifest.get("files")
    if (
        not isinstance(files, dict)
        or METADATA not in files
        or not isinstance(manifest.get("step"), int)
        or not all(
            _is_file_name(n)
            and isinstance(d, dict)
            and isinstance(d.get("size"), int)
            and isinstance(d.get("sha256"), str)
            for n, d in files.items()
        )
    ):
        raise CheckpointError(damaged.format("no valid step and files: {name: {size, sha256}} with .metadata"))
    return manifest


def _is_file_name(name: Any) -> bool:
    """A plain file name inside the checkpoint directory (no path, not the manifest)."""
    return isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name and "\\" not in name


# --- file checksums -------------------------------------------------------------------------


def file_digest(file: Path) -> dict:
    """{"size": bytes, "sha256": hex} of a file, read in 1 MiB blocks."""
    h, size = hashlib.sha256(), 0
    with open(file, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return {"size": size, "sha256": h.hexdigest()}


def _check_file(path: Path, name: str, expected: dict, hash_it: bool) -> None:
    file = path / name
    try:
        size = file.stat().st_size if file.is_file() else None
        if size is None:
            raise CheckpointError(f"checkpoint file {file} is missing; the checkpoint is incomplete: {_another(path)}")
        if size != expected["size"]:
            raise CheckpointError(
                f"checkpoint file {file} has {size} bytes, its manifest says {expected['size']} "
                f"(truncated or overwritten): {_another(path)}"
            )
        if hash_it and file_digest(file)["sha256"] != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint file {file} is corrupt (its sha256 differs from the manifest's): {_another(path)}"
            )
    except OSError as e:
        raise CheckpointError(
            f"cannot read checkpoint file {file}: {e.strerror}; fix its permissions or {_another(path)}"
        ) from None


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
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint of tensors never holds")


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
            f"refusing {file}: {e}; it is not DCP metadata of tensors (corrupt or crafted): {_another(path)}"
        ) from None
    bad = _metadata_problem(metadata, path, files)
    if bad:
        raise CheckpointError(f"refusing {file}: {bad}; it was not written by this trainer: {_another(path)}")
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


def open_checkpoint(path: Path, verify: bool = True, pg: dist.ProcessGroup | None = None) -> tuple[dict, Metadata]:
    """Verify checkpoint `path` (see the module docstring); return its manifest and DCP metadata.

    With a process group, every rank checks the manifest and `.metadata`, the ranks share the
    hashing of the data files, and all raise the same CheckpointError if any check fails.
    """
    rank, world = (dist.get_rank(pg), dist.get_world_size(pg)) if pg is not None else (0, 1)
    result: Any = None
    try:
        manifest = read_manifest(path)
        files = manifest["files"]
        for name in sorted(files):
            _check_file(path, name, files[name], hash_it=False)
        data = (path / METADATA).read_bytes()
        if hashlib.sha256(data).hexdigest() != files[METADATA]["sha256"]:
            raise CheckpointError(
                f"checkpoint file {path / METADATA} is corrupt (its sha256 differs from the "
                f"manifest's): {_another(path)}"
            )
        metadata = _load_metadata(path, data, files)
        if verify:
            for name in sorted(set(files) - {METADATA})[rank::world]:
                _check_file(path, name, files[name], hash_it=True)
        result = (manifest, metadata)
    except CheckpointError as e:
        result = e
    except OSError as e:
        result = CheckpointError(f"cannot read checkpoint {path}: {e}; fix its permissions or {_another(path)}")
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
    and data_parallel (dlrm.core.optim_state); returns what to do after the load. CheckpointError
    naming the tables whose saved state fits neither layout."""
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

    `state` is nested dicts of tensors (a subset of what was saved); with `progress.step` in it,
    the loaded step must equal the manifest's. No process group: one process (export). Returns the manifest.
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
    bad = _everyones(nonfinite_tensors(state), pg)
    if bad:  # written before checkpoints were checked, or by another program
        raise CheckpointError(
            f"checkpoint {path} holds NaN or inf in {len(bad)} tensors ({_listed(bad)}): it was saved from "
            f"a diverged run; {_another(path)}"
        )
    step = state.get("progress", {}).get("step")
    if step is not None and int(step.item()) != manifest["step"]:
        raise CheckpointError(
            f"checkpoint {path} holds step {int(step.item())}, its manifest says {manifest['step']} "
            f"(corrupt; load with checkpoint.verify=true to find the file): {_another(path)}"
        )
    return manifest


def nonfinite_tensors(state: dict, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in `state` (nested dicts) with a NaN or inf in the
    pieces this rank holds (every local shard of a ShardedTensor)."""
    bad = []
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            bad += nonfinite_tensors(value, name + ".")
        elif not all(bool(torch.isfinite(t).all()) for t, _, _ in local_pieces(value) if t.dtype.is_floating_point):
            bad.append(name)
    return bad


def _everyones(names: list[str], pg: dist.ProcessGroup | None) -> list[str]:
    """The union over the ranks of `names` (one object collective; `names` alone without a group)."""
    if pg is None:
        return sorted(names)
    every: list[list[str]] = [[] for _ in range(dist.get_world_size(pg))]
    dist.all_gather_object(every, names, group=pg)
    return sorted({n for part in every for n in part})


def _listed(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _tensor_leaves_only(state: Any, prefix: str = "") -> None:
    """Refuse to save a non-tensor (DCP would pickle it, and loading refuses pickled objects)."""
    if isinstance(state, dict):
        for key, value in state.items():
            _tensor_leaves_only(value, f"{prefix}{key}.")
    elif not isinstance(state, torch.Tensor):  # ShardedTensor and DTensor are Tensors too
        raise TypeError(f"checkpoint state {prefix[:-1]} is a {type(state).__name__}, not a tensor")


class Checkpointer:
    """Saves and loads one rank's share of a checkpoint; every rank calls every method.

    Args:
        root: the checkpoint directory (shared by all ranks: one filesystem for all nodes).
        keep: complete checkpoints to keep; older ones that this Checkpointer wrote are deleted after
            a successful save (an earlier invocation's, e.g. the run a continuation resumes, never).
        pg: the process group of all ranks.
        is_main: whether this is rank 0 (it renames, writes the manifest and prunes).
        every: when `maybe_save` saves (default: never; `save` always does).
    """

    def __init__(self, root: Path, keep: int, pg: dist.ProcessGroup, is_main: bool, every: Every | None = None) -> None:
        self.root = root
        self.keep = keep
        self.pg = pg
        self.is_main = is_main
        self.every = every or Every(0, at_end=False)
        self.written: set[Path] = set()  # by this Checkpointer: the only ones retention deletes

    def maybe_save(self, step: int, last: bool, state: Callable[[], dict], manifest: Callable[[], dict]) -> Path | None:
        """Save checkpoint `step` of `state()` if `every` is due (all ranks call it); its directory, or None."""
        if not self.every.due(step, last):
            return None
        return self.save(step, state(), manifest())

    def save(self, step: int, state: dict, manifest: dict) -> Path:
        """Write `state` (nested dicts of tensors) as checkpoint `step`, visible only when complete.

        After DCP has written every rank's files, the ranks hash them (each a share), and rank 0
        writes the manifest with every file's size and sha256, then renames the directory.
        """
        _tensor_leaves_only(state)
        bad = _everyones(nonfinite_tensors(state), self.pg)
        if bad:  # a diverged model is never saved, so every complete checkpoint is a good one
            latest = latest_checkpoint(self.root)
            raise NonFiniteCheckpointError(
                f"step {step} not checkpointed: {len(bad)} tensors hold NaN or inf ({_listed(bad)}), the "
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
        if self.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(".*.partial"):
                shutil.rmtree(stale, ignore_errors=True)
        dist.barrier(group=self.pg)
        dcp.save(state, checkpoint_id=str(partial), process_group=self.pg)
        dist.barrier(group=self.pg)
        names = sorted(p.name for p in partial.iterdir() if p.is_file())
        rank, world = dist.get_rank(self.pg), dist.get_world_size(self.pg)
        shares: list[dict[str, dict]] = [{} for _ in range(world)]
        dist.all_gather_object(shares, {n: file_digest(partial / n) for n in names[rank::world]}, group=self.pg)
        if self.is_main:
            files = {name: digest for share in shares for name, digest in share.items()}
            if sorted(files) != names:
                raise RuntimeError(f"ranks saw different files in {partial}: is checkpoint.dir on a shared filesystem?")
            write_manifest(partial, {**manifest, "step": step, "files": files})
            if final.exists():  # an incomplete one (no manifest), or this invocation's own
                shutil.rmtree(final)
            os.replace(partial, final)
            self.written.add(final)
            for old in complete_checkpoints(self.root)[: -self.keep]:
                if old in self.written:  # never one that an earlier invocation of the run wrote
                    log.info(f"checkpoint.keep={self.keep}: deleting {old}")
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier(group=self.pg)
        return final

    def load(self, path: Path, state: dict, expected: dict, verify: bool = True) -> dict:
        """Load checkpoint `path` into `state`'s tensors in place (resharding as needed).

        `expected`: {"model": model_signature(...), "optim": {...}}; a checkpoint whose manifest
        differs is refused, naming each difference ("optim" is compared only when given).
        Returns its manifest.
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


def step_tensor(step: int) -> torch.Tensor:
    return torch.tensor([step], dtype=torch.int64)
