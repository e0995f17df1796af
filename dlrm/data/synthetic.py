"""Criteo-shaped synthetic data made with torch ops on any device: exact, seeded, the same global
batches for any world size.

Sample i of a split is a pure function of (seed, split, i): a counter-based hash of (seed, i) gives
the sample a 64-bit state, and a hash of (state, draw) each of its 32-bit random draws. Rank r of W
makes only its slice of each global batch, and the concatenation of the slices equals the global
batch one process makes. Batches are made on `device` (the training device: on CUDA no host work,
no pinning, no copy), and the numbers do not depend on it: every step is integer arithmetic exact
in int64 or a single correctly rounded float operation (+, -, *, floor), with table look-ups in
place of transcendental functions (whose CPU vector and scalar kernels, and CUDA, differ in the last
bit), so a sample is bit-identical on every device and wherever it falls in a batch.

Per sample:
- 13 dense features ~ N(0, 1) (inverse CDF from a table of 4,096 steps, linear in between, tails
  cut at about 3.7 sigma);
- per sparse feature one base id drawn from a Zipf-like power law over the table's rows (inverse
  CDF from a table per feature), the hot ranks scattered over the table by a multiplicative hash;
  a multi-hot feature (pooling P > 1) adds P - 1 ids (base + offset_j) mod rows, with offsets fixed
  by the seed: MLPerf DLRM-DCNv2's synthesis of multi-hot Criteo, as the Criteo source does;
- a label per task (model.tasks) from a hidden logistic model of the dense features and the base
  ids, so AUC above 0.5 is learnable; task 0's model is fixed, task t > 0's has its own phase of the
  dense weights and salt of the id weights, drawn from (seed, t).
Ids are int32 where every table fits (fbgemm takes int32 indices), lengths are fixed per feature, so
the KJT's lengths, offsets and per-key sizes are constants made once per batch size: building a batch
never synchronises with the device.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from dlrm.config import SyntheticConfig
from dlrm.data.multihot import MultiHotLayout

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31 (from Wellons' hash-prospector search), so x * c < 2**63 for
# x < 2**32: the 32-bit hash below is exact in int64 on every device.
_MUL = (0x21F0AAAD, 0x735A2D97)
_GOLDEN = 0x9E3779B9
_HASH = 2654435761  # Knuth's multiplicative hash constant (a prime): scatters Zipf ranks over a table
_HASH_HI, _HASH_LO = _HASH >> 16, _HASH & 0xFFFF
_KNOT_BITS = 12  # inverse CDFs: 4,096 steps, indexed by a draw's top 12 bits
_FRAC_BITS = 32 - _KNOT_BITS  # the other 20 bits place the value within the step
_MAX_ROWS = 2**47  # the id hash stays exact in int64 below this


def mix32(x):
    """A bijection of [0, 2**32) (xorshift-multiply, two rounds): a Python int or an int64 tensor."""
    x = x ^ (x >> 16)
    x = (x * _MUL[0]) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL[1]) & _M32
    return x ^ (x >> 15)


def mix32_(x: torch.Tensor) -> torch.Tensor:
    """mix32 in place on an int64 tensor of values in [0, 2**32)."""
    x ^= x >> 16
    x *= _MUL[0]
    x &= _M32
    x ^= x >> 15
    x *= _MUL[1]
    x &= _M32
    x ^= x >> 15
    return x


def _key(seed: int, index: int) -> int:
    """The index-th 32-bit key of a seed (any Python int)."""
    return mix32(mix32((seed & _M32) ^ mix32(index * _GOLDEN & _M32)) ^ ((seed >> 32) & _M32))


def _knot_probabilities() -> np.ndarray:
    """The 4,097 probabilities where inverse CDFs are tabulated; the ends pulled in by a quarter step."""
    n = 1 << _KNOT_BITS
    p = np.arange(n + 1, dtype=np.float64) / n
    p[0], p[-1] = 0.25 / n, 1.0 - 0.25 / n
    return p


def _zipf_quantiles(alpha: float, rows: int, p: np.ndarray) -> np.ndarray:
    """x(p) in [1, rows + 1]: the continuous inverse CDF of P(rank k) ~ k^-alpha; rank = floor(x) - 1."""
    n = float(rows)
    if abs(alpha - 1.0) < 1e-9:
        x = np.power(n + 1.0, p)
    else:
        x = np.power((np.power(n + 1.0, 1.0 - alpha) - 1.0) * p + 1.0, 1.0 / (1.0 - alpha))
    return np.clip(x, 1.0, n + 1.0)


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
        device: where batches are made (the training device); the numbers are the same on any.
        tasks: labels per sample: labels [B] for 1, [B, tasks] for more (one hidden model each); the
            first task's labels are the same for any count.
    """

    # long: the source's whole layout (tables, CDFs, multi-hot, tasks) is set up here
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
        device: torch.device | None = None,
        tasks: int = 1,
    ) -> None:
        self.cfg = cfg
        self.tasks = int(tasks)
        self.feature_names = list(feature_names)
        self.rows = [int(r) for r in table_rows]
        self.pooling = [int(p) for p in pooling]
        if max(self.rows, default=1) >= _MAX_ROWS:
            raise ValueError(f"synthetic data supports tables of fewer than 2**47 rows, got {max(self.rows)}")
        self.dense_features = dense_features
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.eval_batches = eval_batches
        self.device = device if device is not None else torch.device("cpu")
        dev = self.device
        # Constants are made on the host and moved by blocking copies: complete before any CUDA
        # stream (the training pipeline's copy stream, where batches are made) reads them.
        f, d = len(self.rows), dense_features
        self._draws = d + f + self.tasks  # dense, one base id per feature, each label's noise
        keys = [_key(seed, i) for i in range(4)]
        self._keys = keys
        # Per draw column k: an odd multiplier and a key (the draw is mix32((a + m_k * b) ^ c_k)).
        cols = range(self._draws)
        self._col_mul = torch.tensor([[(mix32(k ^ keys[2]) & 0x7FFFFFFF) | 1] for k in cols], device=dev)
        self._col_key = torch.tensor([[mix32((k + keys[3]) & _M32)] for k in cols], device=dev)
        # Inverse CDF tables, one row per draw column: normal (dense), Zipf x (per feature), logistic.
        p = _knot_probabilities()
        normal = np.array([statistics.NormalDist().inv_cdf(q) for q in p])
        logistic = np.log(p / (1.0 - p))
        tables = [normal] * d + [_zipf_quantiles(cfg.zipf_alpha, r, p) for r in self.rows] + [logistic] * self.tasks
        table = np.stack(tables)  # [K, 4097]
        self._cdf_base = torch.tensor(table[:, :-1].reshape(-1), dtype=torch.float64, device=dev)
        self._cdf_step = torch.tensor(np.diff(table, axis=1).reshape(-1), dtype=torch.float64, device=dev)
        self._cdf_row = (torch.arange(self._draws)[:, None] << _KNOT_BITS).to(dev)  # [K, 1]
        self._max_rank = torch.tensor([[r - 1.0] for r in self.rows], dtype=torch.float64, device=dev)  # max rank
        self._rows_i64 = torch.tensor([[r] for r in self.rows], dtype=torch.int64, device=dev)  # [F, 1]
        # Hidden model per task: fixed dense weights; the weight of (feature f, id) comes from a hash of
        # both. Task t > 0 shifts the weights' phase and salts the hash by a key of (seed, t).
        task_keys = [0] + [_key(seed, 4 + t) for t in range(1, self.tasks)]
        phases = [k * 2.0**-32 * 2.0 * math.pi for k in task_keys]
        self._dense_w = [[math.cos(i * 2.399963 + ph) / math.sqrt(d / 2) for i in range(d)] for ph in phases]
        self._feature_salt = [
            torch.tensor([[(f_ * 7919 + 1 + k) & 0xFFFFF] for f_ in range(f)], device=dev) for k in task_keys
        ]
        # Multi-hot offsets: feature f's id j is (base + offsets[f][j]) mod rows, offsets[f][0] = 0.
        self.offsets = [
            [0] + [1 + mix32((mix32(fi ^ keys[1]) + j) & _M32) % (r - 1) if r > 1 else 0 for j in range(1, p_)]
            for fi, (r, p_) in enumerate(zip(self.rows, self.pooling, strict=True))
        ]
        self._layouts: dict[int, MultiHotLayout] = {}

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
        """Samples first .. first+count-1 of a split as a Batch (dense [B, N], KJT, labels [B] or
        [B, tasks]) on `device`, B = count."""
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}: use 'train' or 'eval'")
        offset = self.cfg.eval_offset if split == "eval" else 0
        d, f = self.dense_features, len(self.rows)
        # Column-major throughout ([K, B]: one row per draw), so per-column constants broadcast as
        # scalars along contiguous rows, and the ids come out key-major, as the KJT wants them.
        draws = self._uniform_draws(first + offset, count)  # int64 [K, B] in [0, 2**32)
        values = self._inverse_cdf(draws)  # float64 [K, B]
        dense = values[:d]
        ranks = torch.minimum(values[d : d + f].floor_() - 1.0, self._max_rank).clamp_(min=0.0).long()
        base = self._scatter(ranks)  # int64 [F, B]
        noise = values[d + f :]  # [tasks, B]
        labels = torch.stack([(noise[t] < self._hidden_logit(dense, base, t)).float() for t in range(self.tasks)])
        labels = labels[0] if self.tasks == 1 else labels.t().contiguous()
        return Batch(
            dense_features=dense.t().float().contiguous(),
            sparse_features=self._layout(count).kjt(base),
            labels=labels,
        )

    def _uniform_draws(self, first: int, count: int) -> torch.Tensor:
        """32-bit draws [K, count] of samples first, first + 1, ...: a function of (seed, sample, column)."""
        s = torch.arange(first, first + count, dtype=torch.int64, device=self.device)
        lo, hi = s & _M32, s >> 32
        a = mix32_(mix32_(lo ^ self._keys[0]) ^ hi)  # (a, b): a 64-bit state per sample, a bijection
        b = mix32_(mix32_(lo ^ self._keys[1]) ^ hi)  # of the index for any 2**32 consecutive samples
        r = b * self._col_mul  # [K, B], < 2**63
        r += a
        r &= _M32
        r ^= self._col_key
        return mix32_(r)

    def _inverse_cdf(self, draws: torch.Tensor) -> torch.Tensor:
        """Each column's quantile function at its draws, from its table: linear within each step."""
        step = ((draws >> _FRAC_BITS) + self._cdf_row).reshape(-1)
        frac = (draws & ((1 << _FRAC_BITS) - 1)).double() * 2.0**-_FRAC_BITS  # exact
        out = self._cdf_step.index_select(0, step).view_as(frac) * frac
        return out.add_(self._cdf_base.index_select(0, step).view_as(frac))

    def _scatter(self, ranks: torch.Tensor) -> torch.Tensor:
        """Zipf ranks [F, B] -> ids (rank * _HASH + 12345) mod rows, exact in int64 below 2**47 rows."""
        rows = self._rows_i64
        ids = torch.remainder(ranks * _HASH_HI, rows) * 65536
        ids += ranks * _HASH_LO + 12345
        return torch.remainder(ids, rows)

    def _hidden_logit(self, dense: torch.Tensor, base: torch.Tensor, task: int = 0) -> torch.Tensor:
        """Task `task`'s true logit [B]: a dense linear term plus a weight in [-1, 1) per (feature, base id).

        Summed in a fixed order (integers exactly, floats row by row), never by a float reduction
        whose order could depend on the batch size or the device.
        """
        f = base.shape[0]
        h = ((base & 0xFFFFF) * (_HASH & 0xFFFFF) + self._feature_salt[task]) & 0xFFFFF  # [F, B] in [0, 2**20)
        sparse = (h.sum(dim=0).double() * 2.0**-19 - f) / math.sqrt(f / 3.0)  # unit variance
        w = self._dense_w[task]
        if dense.shape[0] == 0:  # no dense features: the sparse term alone
            return self.cfg.signal * sparse - 1.0
        linear = dense[0] * w[0]
        for i in range(1, dense.shape[0]):
            linear += dense[i] * w[i]
        return self.cfg.signal * (sparse + 0.5 * linear) - 1.0

    def _layout(self, count: int) -> MultiHotLayout:
        if count not in self._layouts:
            self._layouts[count] = MultiHotLayout(self.feature_names, self.rows, self.offsets, count, self.device)
        return self._layouts[count]
