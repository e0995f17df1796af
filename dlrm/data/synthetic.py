"""Criteo-shaped synthetic data: exact, seeded, and the same global batches for any world size.

Every sample owns a fixed run of a counter-based random stream (numpy's Philox), so sample i is
a pure function of (seed, split, i). Rank r of W generates only its slice of each global batch,
and the concatenation of all slices equals the global batch a single process would generate.

Per sample: 13 dense features ~ N(0, 1); for each sparse feature, `pooling` ids drawn from a
Zipf-like power law over the table's rows (hot ids scattered over the table by a bijective
hash); a label drawn from a hidden logistic model of the features, so AUC above 0.5 is learnable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import SyntheticConfig

_HASH = np.uint64(2654435761)  # Knuth's multiplicative hash constant (a prime)
_TO_UNIT = 2.0**-53


class SyntheticSource:
    """Batches of synthetic data: `batches(split, rank, world_size)` yields this rank's slices.

    Args:
        cfg: zipf exponent, label signal strength, offset of the eval stream.
        feature_names: sparse feature names, in KJT key order.
        table_rows: rows of the table serving each feature (ids are drawn below it).
        pooling: ids per sample for each feature.
        dense_features: number of dense features (13 for Criteo).
        global_batch_size: samples per global batch (all ranks together).
        seed: stream key; the same seed gives the same data everywhere.
        eval_batches: global batches in one pass over the eval split.
    """

    def __init__(
        self,
        cfg: SyntheticConfig,
        feature_names: Sequence[str],
        table_rows: Sequence[int],
        pooling: Sequence[int],
        dense_features: int,
        global_batch_size: int,
        seed: int,
        eval_batches: int,
    ) -> None:
        self.cfg = cfg
        self.feature_names = list(feature_names)
        self.rows = np.asarray(table_rows, dtype=np.uint64)
        self.pooling = list(pooling)
        self.dense_features = dense_features
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.eval_batches = eval_batches
        # int32 ids where every table fits (fbgemm's kernels take int32 indices): half the bytes to
        # build, pin and copy to the device; int64 otherwise.
        self._id_dtype = np.int32 if int(self.rows.max(initial=0)) <= np.iinfo(np.int32).max else np.int64
        self._dense_draws = 2 * math.ceil(dense_features / 2)  # Box-Muller uses pairs
        draws = self._dense_draws + sum(self.pooling) + 1  # + 1 for the label
        self._draws = 4 * math.ceil(draws / 4)  # Philox gives 4 draws per counter value
        # Hidden model: fixed dense weights; per-id weights come from a hash of (feature, id).
        self._dense_w = np.cos(np.arange(dense_features) * 2.399963) / math.sqrt(dense_features / 2)

    def num_batches(self, split: str) -> int | None:
        """Global batches in one pass: None (endless) for train, `eval_batches` for eval."""
        return None if split == "train" else self.eval_batches

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> Iterator[Batch]:
        """This rank's slice (global_batch_size // world_size samples) of batches start_step, ..."""
        per_rank = self.global_batch_size // world_size
        total = self.num_batches(split)
        step = start_step
        while total is None or step < total:
            first = step * self.global_batch_size + rank * per_rank
            yield self.samples(split, first, per_rank)
            step += 1

    def samples(self, split: str, first: int, count: int) -> Batch:
        """Samples first .. first+count-1 of a split as a Batch (dense [B, 13], KJT, labels [B])."""
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
        offset = self.cfg.eval_offset if split == "eval" else 0
        counter = (first + offset) * (self._draws // 4)
        bits = np.random.Philox(key=[self.seed, 0], counter=counter).random_raw(count * self._draws)
        u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * _TO_UNIT  # in (0, 1)
        u = u.reshape(count, self._draws)

        dense = _box_muller(u[:, : self._dense_draws])[:, : self.dense_features]
        col = self._dense_draws
        ids_per_feature: list[np.ndarray] = []
        for f, pool in enumerate(self.pooling):
            ids_per_feature.append(self._zipf_ids(u[:, col : col + pool], self.rows[f]))
            col += pool
        logit = self._hidden_logit(dense, ids_per_feature)
        labels = (u[:, col] < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)

        values = np.concatenate([ids.reshape(-1) for ids in ids_per_feature]).astype(self._id_dtype)
        lengths = np.concatenate([np.full(count, pool, dtype=np.int32) for pool in self.pooling])
        return Batch(
            dense_features=torch.from_numpy(dense.astype(np.float32)),
            sparse_features=KeyedJaggedTensor(
                keys=self.feature_names,
                values=torch.from_numpy(values),
                lengths=torch.from_numpy(lengths),
            ),
            labels=torch.from_numpy(labels),
        )

    def _zipf_ids(self, u: np.ndarray, rows: np.uint64) -> np.ndarray:
        """Ids in [0, rows) with P(rank k) ~ k^-alpha (continuous inverse CDF), hash-scattered."""
        a, n = self.cfg.zipf_alpha, float(rows)
        if abs(a - 1.0) < 1e-9:
            x = np.power(n + 1.0, u)
        else:
            x = np.power((np.power(n + 1.0, 1.0 - a) - 1.0) * u + 1.0, 1.0 / (1.0 - a))
        rank = np.clip(np.floor(x) - 1.0, 0, n - 1).astype(np.uint64)
        return (rank * _HASH + np.uint64(12345)) % rows

    def _hidden_logit(self, dense: np.ndarray, ids: list[np.ndarray]) -> np.ndarray:
        """The labels' true logit: a dense linear term plus a weight in [-1, 1] per (feature, id)."""
        sparse = np.zeros(dense.shape[0])
        for f, feature_ids in enumerate(ids):
            h = (feature_ids * _HASH + np.uint64(f * 7919 + 1)) % np.uint64(1 << 20)
            sparse += (h.astype(np.float64) / (1 << 19) - 1.0).mean(axis=1)
        sparse /= math.sqrt(len(ids) / 3.0)  # unit variance for uniform weights
        return self.cfg.signal * (sparse + 0.5 * dense @ self._dense_w) - 1.0


def _box_muller(u: np.ndarray) -> np.ndarray:
    """Standard normals from uniforms in (0, 1): [B, 2k] -> [B, 2k]."""
    u1, u2 = u[:, 0::2], u[:, 1::2]
    r = np.sqrt(-2.0 * np.log(u1))
    return np.concatenate([r * np.cos(2 * math.pi * u2), r * np.sin(2 * math.pi * u2)], axis=1)
