"""A checkpoint's manifest.json: canonical JSON carrying its own sha256, the size and sha256 of every
file of the checkpoint, the model signature a checkpoint must match to load, and how the model read
its data (`data_signature`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dlrm.checkpoint.layout import MANIFEST, METADATA, CheckpointError, another_checkpoint
from dlrm.common.io import UnreadableFileError, parse_json, read_bounded, size_and_sha256, write_atomic
from dlrm.config import DataConfig, ModelConfig
from dlrm.config.choices import DataSource

MANIFEST_LIMIT = 64 << 20  # a file list with digests: kilobytes per rank


def model_signature(cfg: ModelConfig) -> dict:
    """What must match for a checkpoint to load into a model: architecture and table shapes."""
    return asdict(cfg)


def data_signature(cfg: DataConfig) -> dict:
    """How rows become the model's inputs: {"source"} and, for Parquet, {"parquet": {...}}.

    The Parquet part holds the columns (dense, sparse with kinds and weights, labels), id_policy, and
    the dense transforms, non-finite policy, sample-weight column and multi_hot_sizes where set; not
    the paths, split or order, which belong to one dataset.
    """
    signature: dict[str, Any] = {"source": str(cfg.source)}
    if cfg.source == DataSource.parquet:
        p = asdict(cfg.parquet)
        signature["parquet"] = {k: p[k] for k in ("dense", "sparse", "labels", "id_policy")}
        if cfg.parquet.dense_transforms:  # recorded where set: the scorer transforms as training did
            signature["parquet"]["dense_transforms"] = p["dense_transforms"]
        if cfg.parquet.nonfinite != "refuse":
            signature["parquet"]["nonfinite"] = str(cfg.parquet.nonfinite)
        if cfg.parquet.weight is not None:  # recorded where set: the scorer weights its metrics by it
            signature["parquet"]["weight"] = cfg.parquet.weight
        if cfg.parquet.multi_hot_sizes is not None:  # recorded where set: older records read as before
            signature["parquet"]["multi_hot_sizes"] = list(cfg.parquet.multi_hot_sizes)
    return json.loads(json.dumps(signature))  # plain str for the enums


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
        policies = [(t.get("vocabulary") or {}).get("policy", "none") for t in (a, b)]  # older records: none
        if policies[0] != policies[1]:
            diffs.append(
                f"table {name}: vocabulary policy {policies[0]} in the checkpoint, {policies[1]} in this model "
                "(a vocabulary's state is the policy's: resume with the same policy)"
            )
    for key in ("interaction", "dense_in_features", "bottom_mlp", "top_mlp", "dcn_num_layers", "dcn_low_rank_dim"):
        if saved.get(key) != current.get(key) and not (key.startswith("dcn") and current.get("interaction") == "dot"):
            diffs.append(f"model.{key}: {saved.get(key)} in the checkpoint, {current.get(key)} in this model")
    return diffs


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
        raise CheckpointError(f"{e}; the checkpoint cannot be trusted: {another_checkpoint(path)}") from None
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is not a complete checkpoint: {file} is missing (an interrupted save "
            f"leaves none); pick a step_* directory that has one: {another_checkpoint(path)}"
        ) from None
    except OSError as e:
        raise CheckpointError(
            f"cannot read {file}: {e.strerror}; fix its permissions or {another_checkpoint(path)}"
        ) from None
    damaged = f"{file} is damaged ({{}}); the checkpoint cannot be trusted: {another_checkpoint(path)}"
    try:
        manifest = parse_json(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError too
        raise CheckpointError(damaged.format(f"not JSON: {e}")) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("manifest_sha256"), str):
        raise CheckpointError(damaged.format("no manifest_sha256: corrupt, or written by an older version"))
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if _canonical(manifest) != data or hashlib.sha256(_canonical(body)).hexdigest() != manifest["manifest_sha256"]:
        raise CheckpointError(damaged.format("its content does not match its manifest_sha256"))
    if not _lists_files(manifest):
        raise CheckpointError(damaged.format("no valid step and files: {name: {size, sha256}} with .metadata"))
    return manifest


def _lists_files(manifest: dict) -> bool:
    """Whether `manifest` has an int step and files {name: {size, sha256}} that include .metadata."""
    files = manifest.get("files")
    return (
        isinstance(files, dict)
        and METADATA in files
        and isinstance(manifest.get("step"), int)
        and all(
            _is_file_name(n)
            and isinstance(d, dict)
            and isinstance(d.get("size"), int)
            and isinstance(d.get("sha256"), str)
            for n, d in files.items()
        )
    )


def _is_file_name(name: Any) -> bool:
    """A plain file name inside the checkpoint directory (no path, not the manifest)."""
    return isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name and "\\" not in name


# --- file checksums -------------------------------------------------------------------------


def file_digest(file: Path) -> dict:
    """{"size": bytes, "sha256": hex} of a file."""
    size, sha256 = size_and_sha256(file, 1 << 20)
    return {"size": size, "sha256": sha256}


def check_file(path: Path, name: str, expected: dict, hash_it: bool) -> None:
    """Check file `name` of checkpoint `path` against its manifest entry `expected` ({size, sha256}).

    Raises:
        CheckpointError: the file is missing, or its size (or, if `hash_it`, its sha256) differs.
    """
    file = path / name
    try:
        size = file.stat().st_size if file.is_file() else None
        if size is None:
            raise CheckpointError(
                f"checkpoint file {file} is missing; the checkpoint is incomplete: {another_checkpoint(path)}"
            )
        if size != expected["size"]:
            raise CheckpointError(
                f"checkpoint file {file} has {size} bytes, its manifest says {expected['size']} "
                f"(truncated or overwritten): {another_checkpoint(path)}"
            )
        if hash_it and file_digest(file)["sha256"] != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint file {file} is corrupt (its sha256 differs from the manifest's): "
                f"{another_checkpoint(path)}"
            )
    except OSError as e:
        raise CheckpointError(
            f"cannot read checkpoint file {file}: {e.strerror}; fix its permissions or {another_checkpoint(path)}"
        ) from None
