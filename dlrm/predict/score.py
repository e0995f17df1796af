"""Scoring: an exported model's logits over batches, and the scores written atomically."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from dlrm.common.errors import UserError
from dlrm.common.io import atomic_path

QUANTIZE = {"int8": torch.qint8, "fp16": torch.float16}  # TorchRec's inference embedding dtypes


@torch.inference_mode()
def score(model: torch.nn.Module, batches: Iterator[Batch], tasks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of every batch, in order, from the exported model's network (no loss).

    Args:
        model: the exported DLRMTrain; its `model` attribute gives the logits.
        tasks: T, the model's tasks.

    Returns:
        (logits [N] float32 for one task, else [N, T]; labels [N] float32 for one label a row, else
        [N, L], L = 0 for unlabeled rows).
    """
    logits, labels = [torch.zeros(0, tasks)], []
    net = cast(torch.nn.Module, model.model)
    for batch in batches:
        logits.append(net(batch.dense_features, batch.sparse_features).float().reshape(-1, tasks))
        labels.append(batch.labels.float().reshape(len(batch.dense_features), -1))
    everything, label_columns = torch.cat(logits), torch.cat(labels) if labels else torch.zeros(0, 1)
    return (
        everything.squeeze(1) if tasks == 1 else everything,
        label_columns.squeeze(1) if label_columns.shape[1] == 1 else label_columns,
    )


def save_atomic(path: Path, scores: np.ndarray) -> None:
    """np.save `scores` to `path` atomically; UserError when it cannot be written."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, scores)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}; free space or choose another --out") from None
