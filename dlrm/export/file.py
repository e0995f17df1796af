"""The exported file (`--format file`, the default): its format, writer and reader.

Runs in one process, no process group: the model described by the checkpoint's manifest is built
whole on the CPU, DCP fills it from the shards, and one file is written atomically with torch.save:

    {"format": "dlrm-export", "version": 2, "step": int,
     "model": ModelConfig as a dict of primitives,
     "tables": [{"name", "rows", "dim", "features"}, ...],
     "data": {"source": "synthetic" | "criteo" | "parquet",
              "parquet": {"dense", "sparse", "labels", "id_policy"}  # with source parquet: how rows
             } or None,                                               # become the model's inputs
                                                 # (and "multi_hot_sizes" where training set it)
     "state_dict": {name: tensor},   # the unsharded DLRMTrain state dict
     "sha256": digest of all the above (canonical JSON of the metadata, then each tensor's name, dtype,
               shape and bytes), so a damaged byte anywhere in the content is detected}

"data" comes from the checkpoint's manifest (None for a checkpoint written before the manifest
recorded it); version 1 files (no "data") are still read, as Criteo-shaped models.
Only tensors, dicts, lists, str, int, float, bool and None: `torch.load(OUT, weights_only=True)` reads
it anywhere, and `load_exported(OUT)` rebuilds the model from it alone (checking keys, shapes and
finite values). The checkpoint is verified first (`--no-verify` skips the data files' sha256).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dlrm.checkpoint import CheckpointError, load_checkpoint, read_manifest, step_tensor
from dlrm.common.errors import UserError
from dlrm.common.io import atomic_path, refuse_alias
from dlrm.config import ModelConfig, ParquetConfig
from dlrm.data.progress import Progress, Step
from dlrm.models.dlrm import build_model

FORMAT, VERSION = "dlrm-export", 2
READS = (1, 2)  # version 1: no "data" (a Criteo-shaped model)


@dataclass(frozen=True)
class ExportedData:
    """How an exported model read its rows.

    Attributes:
        source: "synthetic", "criteo" or "parquet"; None where the export does not record it.
        parquet: with source parquet, the data.parquet columns (`path` unset).
    """

    source: str | None
    parquet: ParquetConfig | None = None


def model_config_of(checkpoint: Path) -> ModelConfig:
    """The model config a checkpoint was written for (from its manifest)."""
    saved = read_manifest(checkpoint).get("model")
    try:
        return cast(ModelConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), saved)))
    except (OmegaConfBaseException, ValueError) as e:
        raise CheckpointError(
            f"{checkpoint / 'manifest.json'}: its model is not a valid model config ({e}); "
            "export a checkpoint written by this trainer"
        ) from None


def table_metadata(cfg: ModelConfig) -> list:
    """[{name, rows, dim, features}] of the model's tables, in order."""
    return [{"name": t.name, "rows": int(t.rows), "dim": int(t.dim), "features": list(t.features)} for t in cfg.tables]


def content_sha256(payload: dict, progress: Progress | None = None) -> str:
    """Hex sha256 of an export's metadata (canonical JSON) and every tensor (name, dtype, shape, bytes).

    Tensors are hashed in name order; `progress`, if given, is updated after each one.
    """
    h = hashlib.sha256()
    keys = ("format", "version", "step", "model", "tables") + (("data",) if payload.get("version") != 1 else ())
    meta = {k: payload.get(k) for k in keys}
    h.update(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    done = 0
    for k, name in enumerate(sorted(payload["state_dict"])):
        t = payload["state_dict"][name].detach().contiguous().cpu()
        h.update(f"\n{name}:{t.dtype}:{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
        done += t.numel() * t.element_size()
        if progress is not None:
            progress.update(done, k + 1)
    return h.hexdigest()


def _mib(state: dict) -> float:
    """The MiB a state dict's tensors hold."""
    return sum(t.numel() * t.element_size() for t in state.values()) / 2**20


def read_checkpoint(checkpoint: Path, verify: bool = True) -> dict:
    """The export's content (format, version, step, model, tables, data, state_dict, sha256) of a
    checkpoint: the model built whole on the CPU and filled by DCP (verified first; `verify` False
    skips the data files' sha256)."""
    cfg = model_config_of(checkpoint)
    model = build_model(cfg, torch.device("cpu"))
    state = {"model": model.state_dict(), "progress": {"step": step_tensor(-1)}}
    mib = _mib(state["model"])
    doing = f"{'verifying and ' if verify else ''}loading {len(cfg.tables)} tables ({mib:,.1f} MiB) from {checkpoint}"
    with Step("export", doing, mib):
        load_checkpoint(checkpoint, state, verify)
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(state["progress"]["step"].item()),
        "model": OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
        "tables": table_metadata(cfg),
        "data": read_manifest(checkpoint).get("data"),
        "state_dict": state["model"],
    }
    tensors = len(state["model"])
    with Step("export", f"hashing {tensors} tensors ({mib:,.1f} MiB)", mib):
        payload["sha256"] = content_sha256(payload, Progress("export: hashing", mib * 2**20, unit="tensors"))
    return payload


def export(checkpoint: Path, out: Path, verify: bool = True) -> dict:
    """Write the checkpoint's model, unsharded and with its config, to the file `out` atomically.

    Args:
        checkpoint: a checkpoint directory.
        out: the file to write, in an existing directory.
        verify: check the checkpoint's data files' sha256 before loading.

    Returns:
        The written state dict.

    Raises:
        UserError: `out` is the checkpoint, a directory, or cannot be written.
    """
    refuse_alias(out, "the output", {"the checkpoint": checkpoint})
    if not out.parent.is_dir() or out.is_dir():
        raise UserError(
            f"cannot write {out}: {'it is a directory' if out.is_dir() else 'its directory does not exist'}; "
            "give a file path in an existing directory"
        )
    payload = read_checkpoint(checkpoint, verify)
    mib = _mib(payload["state_dict"])
    try:
        with Step("export", f"writing {out} ({mib:,.1f} MiB)", mib), atomic_path(out) as tmp:
            torch.save(payload, tmp)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
        raise UserError(f"cannot write {out}: {e}; free space or choose another path") from None
    return payload["state_dict"]


def _refuse(path: Path, what: str) -> UserError:
    return UserError(
        f"{path} is not a usable dlrm export: {what}; re-export it with "
        f"`python -m dlrm.export CHECKPOINT_DIR {path}` from an intact checkpoint"
    )


def _load(path: Path) -> dict:
    """The exported file's content (weights-only torch.load), its format and version checked."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{path} does not exist; give the file written by `python -m dlrm.export`") from None
    except IsADirectoryError:
        raise UserError(
            f"{path} is a directory; give the file written by `python -m dlrm.export` "
            "(a checkpoint directory must be exported first)"
        ) from None
    except Exception as e:  # torch.load raises many kinds on damaged or crafted files; none runs code (weights_only)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise _refuse(path, f"it cannot be read as a weights-only torch file ({reason})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        old = isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values())
        raise _refuse(
            path,
            "a bare state dict without its model config (an older export)"
            if old and data
            else f"no 'format': {FORMAT!r} entry",
        )
    if data.get("version") not in READS:
        raise _refuse(
            path, f"format version {data.get('version')!r}, this program reads {' and '.join(map(str, READS))}"
        )
    return data


def data_of(path: Path, record, cfg: ModelConfig) -> ExportedData:
    """The export's "data" entry, checked against its model config."""
    if record is None:
        return ExportedData(None)
    if not isinstance(record, dict) or not isinstance(record.get("source"), str):
        raise _refuse(path, "its 'data' is not a {'source': ...} record")
    if record["source"] != "parquet":
        return ExportedData(record["source"])
    try:
        columns = OmegaConf.merge(OmegaConf.structured(ParquetConfig), record.get("parquet"))
        parquet = cast(ParquetConfig, OmegaConf.to_object(columns))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise _refuse(
            path, f"its 'data.parquet' is not a valid data.parquet section ({str(e).splitlines()[0]})"
        ) from None
    features = [f for t in cfg.tables for f in t.features]
    if (
        sorted(s.name for s in parquet.sparse) != sorted(features)
        or parquet.dense_width() != cfg.dense_in_features
        or len(parquet.labels) != len(cfg.tasks)
    ):
        raise _refuse(path, "its 'data.parquet' columns disagree with its model config")
    return ExportedData("parquet", parquet)


def read_exported(path: Path) -> tuple[ModelConfig, dict, ExportedData]:
    """Read an exported file and check its structure, digest and tensors against its model config.

    Returns:
        (model config, state dict, how the model read its rows).

    Raises:
        UserError: the file is missing, unreadable, of another format or version, damaged, or its
            tensors disagree with its model config; the message names the file and the fix.
    """
    path = Path(path)
    data = _load(path)
    try:
        cfg = cast(
            ModelConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), data.get("model")))
        )
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise _refuse(path, f"its 'model' is not a valid model config ({str(e).splitlines()[0]})") from None
    if data.get("tables") != table_metadata(cfg):
        raise _refuse(path, "its 'tables' disagree with its model config")
    state = data.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise _refuse(path, "'state_dict' is not a dict of tensors")
    odd = next((n for n, t in state.items() if t.layout != torch.strided), None)
    if odd is not None:  # a sparse or otherwise non-dense tensor: no layer of ours holds one
        raise _refuse(path, f"'{odd}' is a {state[odd].layout} tensor, not a dense one")
    if data.get("sha256") != content_sha256(data):
        raise _refuse(path, "its content differs from its sha256 (a damaged or edited file)")
    _check_state(path, cfg, state)
    return cfg, state, data_of(path, data.get("data"), cfg)


def _check_state(path: Path, cfg: ModelConfig, state: dict) -> None:
    """The state dict's names, shapes and dtypes are the model config's, its values finite."""
    expected = build_model(cfg).state_dict()  # on the meta device: names and shapes, no memory
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise _refuse(
            path, f"its state dict does not match its model config (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for name, t in state.items():
        want = expected[name]
        if t.shape != want.shape or t.dtype != want.dtype:
            raise _refuse(
                path,
                f"'{name}' is {t.dtype} {list(t.shape)} but the model config needs {want.dtype} {list(want.shape)}",
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise _refuse(path, f"'{name}' holds NaN or infinite values")


def load_exported(path: Path) -> torch.nn.Module:
    """The unsharded model (DLRMTrain, eval mode) rebuilt from an exported file alone."""
    cfg, state, _ = read_exported(path)
    model = build_model(cfg)  # meta: the file's tensors become the parameters
    model.load_state_dict(state, assign=True)
    return model.eval()
