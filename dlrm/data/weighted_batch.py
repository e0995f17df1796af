"""A batch whose rows carry sample weights: TorchRec's `Batch` and weights [B] float32.

Readers take `getattr(batch, "weights", None)`: a plain `Batch` is unweighted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec.datasets.utils import Batch


@dataclass
class WeightedBatch(Batch):
    """`Batch(dense_features, sparse_features, labels)` and `weights` [B] float32, each row's sample
    weight (finite, >= 0), moved, pinned and stream-recorded with the rest."""

    weights: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> WeightedBatch:
        moved = super().to(device, non_blocking=non_blocking)
        return WeightedBatch(
            moved.dense_features,
            moved.sparse_features,
            moved.labels,
            self.weights.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.weights.record_stream(stream)

    def pin_memory(self) -> WeightedBatch:
        pinned = super().pin_memory()
        return WeightedBatch(pinned.dense_features, pinned.sparse_features, pinned.labels, self.weights.pin_memory())


def with_weights(batch: Batch, weights: torch.Tensor) -> WeightedBatch:
    """`batch` with sample weights [B] float32 (one per row of `batch.labels`)."""
    return WeightedBatch(batch.dense_features, batch.sparse_features, batch.labels, weights)
