"""Dense transforms: a dense column's raw values -> the model's input (data.parquet.dense_transforms).

One definition, two implementations that agree to float32 rounding: `DenseTransform.apply` (numpy,
where batches are made) and `DenseTransformModule` (torch, for a served model that takes raw values). Per
column, in order: clip to [lo, hi], log1p of max(x, 0), (x - mean) / std; a missing value (NaN on
input: a null, or a non-finite value the reader let through) becomes 0, and a column with
`missing_flag` adds one 0/1 input, the flags after all the values: [B, n] -> [B, n + flags].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dlrm.config import DenseTransformConfig


class DenseTransform:
    """The transforms of `columns` (data.parquet.dense, in order) from `transforms` (by column name;
    a column without an entry is passed through, missing -> 0)."""

    def __init__(self, columns: Sequence[str], transforms: Mapping[str, DenseTransformConfig]):
        n = len(columns)
        self.columns = list(columns)
        cfgs = [transforms.get(c) for c in columns]
        self.lo = np.array([t.clip[0] if t and t.clip else -np.inf for t in cfgs], np.float32)
        self.hi = np.array([t.clip[1] if t and t.clip else np.inf for t in cfgs], np.float32)
        self.log = np.array([bool(t and t.log1p) for t in cfgs], bool)
        self.mean = np.array([t.mean if t else 0.0 for t in cfgs], np.float32)
        self.std = np.array([t.std if t else 1.0 for t in cfgs], np.float32)
        self.flags = [k for k, t in enumerate(cfgs) if t and t.missing_flag]
        self.identity = not any(transforms.get(c) for c in columns)
        self.width = n + len(self.flags)

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """raw [B, N] float32 (NaN: missing) -> [B, width] float32, finite."""
        if self.identity:
            return np.nan_to_num(raw, nan=0.0) if np.isnan(raw).any() else raw
        missing = np.isnan(raw)
        x = np.clip(raw, self.lo, self.hi)
        if self.log.any():
            x[:, self.log] = np.log1p(np.maximum(x[:, self.log], 0))
        x = (x - self.mean) / self.std
        x[missing] = 0.0
        if not self.flags:
            return x.astype(np.float32, copy=False)
        return np.concatenate([x, missing[:, self.flags]], axis=1).astype(np.float32, copy=False)
