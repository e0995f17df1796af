"""The scorer's bundle input: a bundle directory's compiled program run on the batches the scorer reads
for an exported file (the bundle's spec records the model config and data record)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torchrec.datasets.utils import Batch

from dlrm.common.errors import UserError
from dlrm.common.io import parse_json, read_bounded
from dlrm.config import ModelConfig
from dlrm.export.file import ExportedData, data_of
from dlrm.export.spec import PROGRAM_FILE, SPEC_FILE, SPEC_FORMAT, SPEC_VERSION

SPEC_LIMIT = 64 << 20  # bytes of spec.json read at most


def is_bundle(path: Path) -> bool:
    """Whether `path` is a bundle directory (it holds spec.json)."""
    return path.is_dir() and (path / SPEC_FILE).is_file()


def read_bundle(path: Path) -> tuple[ModelConfig, ExportedData, Any]:
    """Load a bundle directory.

    Returns:
        (model config, how the model read its rows, the loaded program).

    Raises:
        UserError: the spec or program is missing or unreadable; the message names the fix.
    """
    fix = f"re-export it with `python -m dlrm.export CHECKPOINT_DIR {path} --format bundle`"
    spec = parse_json(read_bounded(path / SPEC_FILE, SPEC_LIMIT))
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT or spec.get("version") != SPEC_VERSION:
        raise UserError(f"{path / SPEC_FILE} is not a {SPEC_FORMAT} spec of version {SPEC_VERSION}; {fix}")
    record = spec["dlrm"] if isinstance(spec.get("dlrm"), dict) else {}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), record.get("model"))
        cfg = cast(ModelConfig, OmegaConf.to_object(merged))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise UserError(f"{path / SPEC_FILE}: 'dlrm.model' is not a valid model config ({e}); {fix}") from None
    data = data_of(path, record.get("data"), cfg)
    if not (path / PROGRAM_FILE).is_file():
        raise UserError(f"{path} has no {PROGRAM_FILE}; {fix}")
    try:
        runner = torch._inductor.aoti_load_package(str(path / PROGRAM_FILE))
    except Exception as e:  # AOTInductor's loader raises RuntimeError and others on a damaged package
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{path / PROGRAM_FILE} cannot be loaded ({reason}); {fix}") from None
    return cfg, data, runner


def program_inputs(batch: Batch, cfg: ModelConfig) -> list[torch.Tensor]:
    """The program's inputs of a batch: dense [B, n] float32, then per feature values int64, lengths int64
    (and weights float32 for a weighted model), features in table order."""
    kjt = batch.sparse_features
    per_key = kjt.to_dict()
    inputs = [batch.dense_features.float().contiguous()]
    for t in cfg.tables:
        for f in t.features:
            jt = per_key[f]
            inputs += [jt.values().long(), jt.lengths().long()]
            if cfg.weighted:
                inputs.append(jt.weights().float())
    return inputs


def bundle_logits(runner: Any, cfg: ModelConfig, batches: Iterator[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a bundle's program over `batches`.

    Returns:
        (logits, labels) shaped as `score.score` gives them: logits [N] or [N, T] float64, the logit
        of the program's float32 probabilities; labels [N] or [N, L] float32.
    """
    tasks = len(cfg.tasks)
    probabilities, labels = [torch.zeros(0, tasks)], []
    for batch in batches:
        out = runner(*program_inputs(batch, cfg))
        out = out[0] if isinstance(out, list | tuple) else out
        probabilities.append(out.reshape(-1, tasks))
        labels.append(batch.labels.float().reshape(len(batch.dense_features), -1))
    p = torch.cat(probabilities)
    logits = torch.logit(p.double())
    label_columns = torch.cat(labels) if labels else torch.zeros(0, 1)
    return (
        logits.squeeze(1) if tasks == 1 else logits,
        label_columns.squeeze(1) if label_columns.shape[1] == 1 else label_columns,
    )
