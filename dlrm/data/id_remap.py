"""Contiguous ids, as MLPerf's preprocessing: count each raw id, keep the frequent ones, map them to rows 1..K."""

from __future__ import annotations

import numpy as np


class IdCounter:
    """Counts of the ids of one sparse column, fed block by block (memory ~ 16 bytes per distinct id)."""

    def __init__(self):
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending, self.merged = 0, 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(np.unique(ids, return_counts=True))
        self.pending += len(self.parts[-1][0])
        if self.pending > 2 * self.merged + (1 << 20):  # merge rarely: amortised O(n log n)
            self._merge()

    def _merge(self) -> None:
        ids = np.concatenate([u for u, _ in self.parts])
        counts = np.concatenate([n for _, n in self.parts])
        uniq, inverse = np.unique(ids, return_inverse=True)
        self.parts = [(uniq, np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64))]
        self.pending = self.merged = len(uniq)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct ids, their counts)."""
        if not self.parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._merge()
        return self.parts[0]


def to_contiguous(raw: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Raw ids [n] -> rows: 1 + position in the sorted `vocab`, or 0 for ids not in it. int32 [n]."""
    if len(vocab) == 0:
        return np.zeros(len(raw), np.int32)
    idx = np.searchsorted(vocab, raw)
    found = vocab[np.minimum(idx, len(vocab) - 1)] == raw
    return np.where(found, idx + 1, 0).astype(np.int32)
