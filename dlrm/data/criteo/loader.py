"""Distributed loader of preprocessed Criteo (the preprocess command's .npy days), memory-mapped.

The rows of a split (its days, in order, seen as one array) are cut into global batches of
`global_batch_size` consecutive rows; the last partial global batch is dropped. Rank r of W reads only
rows [r * b, (r + 1) * b) of each global batch, b = global_batch_size // W, so the global batches are
the same for every world size. Train batch order is a permutation seeded by (seed, epoch); eval is in
order, one pass. `batches(..., start_step=k)` continues exactly where step k would be.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from dlrm.config import CriteoConfig
from dlrm.data.criteo.format import NUM_DENSE, NUM_SPARSE, CriteoDataError
from dlrm.data.criteo.verify import load_manifest, verify_days
from dlrm.data.multihot import BaseIdBatch, MultiHotLayout
from dlrm.data.prefetch import Prefetcher

log = logging.getLogger(__name__)

MULTI_HOT_SEED = 0  # fixed: the multi-hot ids are part of the data, not of the training run
SPLITS = ("train", "eval")


__all__ = ["CriteoDataError", "CriteoSource", "load_manifest", "multi_hot_offsets"]


def multi_hot_offsets(sizes: Sequence[int], table_rows: Sequence[int]) -> list[np.ndarray]:
    """Per column c: int64 [sizes[c]] offsets, the first 0; sample ids are (id + offset) % table_rows[c].

    Like MLPerf DLRM-DCNv2's synthesis, extra ids are a fixed pseudo-random function of the one-hot id.
    """
    rng = np.random.default_rng(MULTI_HOT_SEED)
    out = []
    for m, rows in zip(sizes, table_rows, strict=True):
        extra = rng.integers(1, rows, m - 1) if rows > 1 else np.zeros(m - 1, np.int64)
        out.append(np.concatenate([[0], extra]).astype(np.int64))
    return out


class _Split:
    """Rows of some days seen as one array: segments (day, lo, hi) in order."""

    def __init__(self, segments: list[tuple[int, int, int]], arrays: dict[int, dict[str, np.ndarray]]):
        self.segments = [s for s in segments if s[2] > s[1]]
        self.arrays = arrays
        self.starts = np.cumsum([0] + [hi - lo for _, lo, hi in self.segments])
        self.rows = int(self.starts[-1])

    def read(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Rows [start, start + count) as dense [n, 13], sparse [n, 26], labels [n, 1] (copies)."""
        parts: dict[str, list[np.ndarray]] = {"dense": [], "sparse": [], "labels": []}
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        while count > 0:
            day, lo, hi = self.segments[i]
            a = lo + start - int(self.starts[i])
            n = min(count, hi - a)
            for k in parts:
                parts[k].append(self.arrays[day][k][a : a + n])
            start, count, i = start + n, count - n, i + 1
        return {k: np.concatenate(v) if len(v) > 1 else np.array(v[0]) for k, v in parts.items()}


def split_days(cfg: CriteoConfig, manifest: dict) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The train and eval splits as (day, first row, end row) segments: data.criteo.train_days (default:
    every day not in eval_days) and eval_days, or with no eval days the last data.criteo.eval_fraction
    of the train days' rows held out."""
    days = {int(d["day"]): d for d in manifest["days"]}
    eval_days = [int(d) for d in cfg.eval_days]
    train_days = [int(d) for d in cfg.train_days] or [d for d in sorted(days) if d not in eval_days]
    for key, chosen in (("data.criteo.train_days", train_days), ("data.criteo.eval_days", eval_days)):
        missing = [d for d in chosen if d not in days]
        if missing:
            raise CriteoDataError(
                f"{key} lists day(s) {missing} but {cfg.dir}/manifest.json has days {sorted(days)}; "
                f"preprocess those input files or change {key}"
            )
    train = [(d, 0, days[d]["rows"]) for d in train_days]
    evals = [(d, 0, days[d]["rows"]) for d in eval_days]
    if not eval_days and cfg.eval_fraction > 0:
        if not 0 < cfg.eval_fraction < 1:
            raise CriteoDataError(f"data.criteo.eval_fraction = {cfg.eval_fraction}: use a fraction in (0, 1)")
        total = sum(hi for _, _, hi in train)
        held = int(total * cfg.eval_fraction)
        train, evals, left = [], [], total - held
        for d in train_days:
            n = days[d]["rows"]
            take = max(0, min(n, left))
            train.append((d, 0, take))
            evals.append((d, take, n))
            left -= take
    return train, evals


class CriteoSource:
    """Batches of preprocessed Criteo for one rank: `Batch(dense [b, 13] f32, sparse KJT, labels [b] f32)`.

    Args:
        cfg: the data.criteo section.
        feature_names: feature_names[c] is the KJT key of sparse column C{c+1}.
        table_rows: table_rows[c] is the rows of that column's table.
        global_batch_size: B; a rank's batches hold b = B / W rows.
        seed: seeds the train split's batch order.
        expand_on: with multi-hot sizes, batches are `BaseIdBatch`es whose ids expand when moved to
            this device (give the GPU); None expands on the host, in the reader thread.

    Raises:
        CriteoDataError: no directory, not 26 features, a bad manifest, multi-hot sizes or day file, or
            a train split under one global batch.

    Example: `CriteoSource(cfg.data.criteo, names, rows, 2048, seed=0).batches("train", rank, world)`.
    """

    def __init__(
        self,
        cfg: CriteoConfig,
        feature_names: list[str],
        table_rows: list[int],
        global_batch_size: int,
        seed: int,
        expand_on: torch.device | None = None,
    ):
        if not cfg.dir:
            raise CriteoDataError(
                "data.criteo.dir is not set: point it at the --out directory of dlrm.data.criteo.preprocess"
            )
        if len(feature_names) != NUM_SPARSE or len(table_rows) != NUM_SPARSE:
            raise CriteoDataError(
                f"Criteo has {NUM_SPARSE} sparse columns but the model has {len(feature_names)} features "
                f"({feature_names}); give the model one single-feature table per column C1..C26"
            )
        self.cfg, self.names, self.table_rows = cfg, list(feature_names), [int(r) for r in table_rows]
        self.global_batch_size, self.seed = int(global_batch_size), int(seed)
        self.expand_on = expand_on
        self.manifest = load_manifest(cfg.dir)
        train, evals = split_days(cfg, self.manifest)
        self.arrays: dict[int, dict[str, np.ndarray]] = {}  # filled below, once verified
        self.splits = {"train": _Split(train, self.arrays), "eval": _Split(evals, self.arrays)}
        if self.splits["train"].rows < self.global_batch_size:
            raise CriteoDataError(
                f"the train split of {cfg.dir} has {self.splits['train'].rows} rows, less than one global "
                f"batch of {self.global_batch_size}; lower data.global_batch_size or add train days"
            )

        self.multi_hot = None
        self._layouts: dict[tuple[int, torch.device], MultiHotLayout] = {}  # the KJT's constants per batch size
        if cfg.multi_hot_sizes:
            sizes = [int(m) for m in cfg.multi_hot_sizes]
            if len(sizes) != NUM_SPARSE or min(sizes) < 1:
                raise CriteoDataError(
                    f"data.criteo.multi_hot_sizes = {sizes}: give {NUM_SPARSE} sizes >= 1 (columns C1..C26), or null"
                )
            self.multi_hot = (sizes, multi_hot_offsets(sizes, self.table_rows))
        # the contents last: the only check that reads whole files
        days_used = sorted({day for day, _, _ in train + evals})
        self.arrays.update(
            verify_days(
                cfg.dir, self.manifest, days_used, self.names, self.table_rows, cfg.verify_checksums, report=log.info
            )
        )

    def num_batches(self, split: str) -> int:
        """Global batches per epoch of `split` (train or eval); the last partial batch is dropped."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use one of {SPLITS}")
        return self.splits[split].rows // self.global_batch_size

    def batch_order(self, split: str, epoch: int) -> np.ndarray:
        """Global batch indices of one epoch: a (seed, epoch)-seeded permutation for shuffled train."""
        n = self.num_batches(split)
        if split == "train" and self.cfg.shuffle:
            return np.random.default_rng([self.seed, epoch]).permutation(n)
        return np.arange(n)

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> Prefetcher[Batch | BaseIdBatch]:
        """This rank's slices of global batches start_step, start_step + 1, ... (train: endless; eval: one pass).

        Raises:
            ValueError: an unknown split, a global batch size not divisible by `world_size`, or `rank`
                outside it.
        """
        self.num_batches(split)  # checks the split's name
        if self.global_batch_size % world_size or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank} of world size {world_size}: data.global_batch_size={self.global_batch_size} "
                f"must be divisible by the world size, and 0 <= rank < world size"
            )
        return Prefetcher(self._produce(split, rank, world_size, start_step), max(1, self.cfg.prefetch_batches))

    def _produce(self, split: str, rank: int, world_size: int, start_step: int) -> Iterator[Batch]:
        n = self.num_batches(split)
        b = self.global_batch_size // world_size
        step = start_step
        epoch = step // n
        order = self.batch_order(split, epoch)
        while split == "train" or step < n:
            e, j = divmod(step, n)
            if e != epoch:
                epoch, order = e, self.batch_order(split, e)
            yield self.make_batch(self.splits[split].read(int(order[j]) * self.global_batch_size + rank * b, b))
            step += 1

    def make_batch(self, rows: dict[str, np.ndarray]) -> Batch:
        """Arrays of b rows -> Batch; KJT values are key-major (all of feature 0, then feature 1, ...),
        int32 where every table fits, with the multi-hot ids expanded on the host. With `expand_on` set
        (a GPU) and multi-hot sizes, the Batch is a `BaseIdBatch`: the one id per feature of the file,
        expanded when moved to the device."""
        ids = rows["sparse"]  # [b, 26], int32 or int64
        b = ids.shape[0]
        dense = torch.from_numpy(np.ascontiguousarray(rows["dense"], np.float32).reshape(b, NUM_DENSE))
        labels = torch.from_numpy(rows["labels"].reshape(-1).astype(np.float32))
        if self.expand_on is not None and self.multi_hot is not None:  # ids expanded when moved there
            return BaseIdBatch(dense, torch.from_numpy(ids), labels, functools.partial(self.layout, b))
        layout = self.layout(b, torch.device("cpu"))
        return Batch(dense_features=dense, sparse_features=layout.kjt_of_values(layout.expand_host(ids)), labels=labels)

    def layout(self, count: int, device: torch.device) -> MultiHotLayout:
        """The multi-hot layout of `count` samples on `device` (made once per pair)."""
        if (count, device) not in self._layouts:
            offsets = [o.tolist() for o in self.multi_hot[1]] if self.multi_hot is not None else [[0]] * NUM_SPARSE
            self._layouts[count, device] = MultiHotLayout(self.names, self.table_rows, offsets, count, device)
        return self._layouts[count, device]
