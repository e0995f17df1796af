# long file: the Parquet source is one concept: both splits opened and checked, then rows in order
"""A team's own Parquet data as batches (`data.source=parquet`): declared dense, sparse and label
columns, the same global batches on any world size.

The files of a split (sorted by path) are a sequence of row groups: train orders them by a permutation
seeded by (seed, epoch) per epoch (rows inside a row group keep their order), eval reads them in file
order, one pass. Global batch k is rows [k * B, (k + 1) * B) of that sequence (the last partial batch
is dropped); rank r of W takes rows [k * B + r * b, k * B + (r + 1) * b), b = B / W. A dataset
partitioned by time (`data.parquet.periods`) trains on its window period by period, shuffled only
within a period, and evaluates each evaluated period apart. Every failure is a `ParquetDataError`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from dlrm.config import ParquetConfig
from dlrm.config.choices import IdPolicy, SparseKind
from dlrm.config.periods import in_range
from dlrm.data.parquet.batches import BatchMaker
from dlrm.data.parquet.files import ParquetDataError
from dlrm.data.parquet.partitions import ordered, row_group_periods, window_groups
from dlrm.data.parquet.position import GroupRef, Stream, changed_files, continued_stream, file_identity
from dlrm.data.parquet.reader import RowGroupReader, Split
from dlrm.data.parquet.sample_weights import sample_weights
from dlrm.data.parquet.schema import Dataset
from dlrm.data.prefetch import OrderedWorkers

if TYPE_CHECKING:
    import torch
    from torchrec.datasets.utils import Batch

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")


class ParquetSource:
    """Batches of a team's Parquet files for one rank, b = global_batch_size / world rows each.

    A batch is `Batch(dense [b, N] f32, sparse KJT, labels [b] f32 or [b, T] f32)`: N dense columns,
    the KJT's keys `feature_names` with real lengths (and weights when declared), T label columns; with
    data.parquet.weight a `WeightedBatch`.

    Args:
        cfg: the data.parquet section.
        feature_names: the model's sparse features, in KJT key order.
        table_rows: the rows of each feature's table (ids must be below it).
        global_batch_size: B, rows per global batch.
        seed: seeds the train split's row-group order.
        expand_on: with data.parquet.multi_hot_sizes, batches are `BaseIdBatch`es whose ids expand
            when moved to this device; None expands them on the host, in the reader workers.
        raw_dense: dense values as read (NaN where missing), not transformed.

    Raises:
        ParquetDataError: no path, schemas that differ or do not match the declaration, a split with
            less than one global batch, or values the files' statistics show out of range.

    Example: `ParquetSource(cfg.data.parquet, names, rows, 2048, seed=0).batches("train", rank, world)`.
    """

    # long: opens both splits and checks their schemas before any batch is read
    def __init__(
        self,
        cfg: ParquetConfig,
        feature_names: Sequence[str],
        table_rows: Sequence[int],
        global_batch_size: int,
        seed: int,
        expand_on: torch.device | None = None,
        raw_dense: bool = False,
    ):
        if not cfg.path:
            raise ParquetDataError("data.parquet.path is not set: point it at your Parquet files")
        self.cfg, self.seed, self.global_batch_size = cfg, int(seed), int(global_batch_size)
        self.names, self.table_rows = list(feature_names), [int(r) for r in table_rows]
        self.maker = BatchMaker(cfg, self.names, self.table_rows, expand_on, raw_dense)
        self.columns = list(self.maker.columns)
        train = Dataset(cfg.path, "data.parquet.path", self.maker.columns)
        groups = list(range(len(train.row_groups)))
        if cfg.eval_path:
            evals = Dataset(cfg.eval_path, "data.parquet.eval_path", self.maker.columns)
            for column, t in evals.types.items():
                if train.types[column] != t:
                    raise ParquetDataError(
                        f"column {column!r} is {train.types[column]} in {train.paths[0]} but {t} in "
                        f"{evals.paths[0]} (data.parquet.eval_path): the files' schemas differ; rewrite them with one "
                        "schema"
                    )
            self.splits = {"train": Split(train, groups), "eval": Split(evals, list(range(len(evals.row_groups))))}
        elif cfg.periods.key:
            self.splits = self._period_splits(train)
        else:
            held = max(1, round(len(groups) * cfg.eval_fraction)) if cfg.eval_fraction > 0 else 0
            if held >= len(groups):
                raise ParquetDataError(
                    f"data.parquet.eval_fraction = {cfg.eval_fraction} holds out all {len(groups)} row group(s) of "
                    f"{cfg.path}; lower it, give data.parquet.eval_path, or write smaller row groups"
                )
            cut = len(groups) - held
            self.splits = {"train": Split(train, groups[:cut]), "eval": Split(train, groups[cut:])}
        if self.splits["train"].rows < self.global_batch_size:
            raise ParquetDataError(
                f"the train split of {cfg.path} has {self.splits['train'].rows} rows, less than one global batch "
                f"of {self.global_batch_size}; lower data.global_batch_size or add rows"
            )

        held_rows = self.splits["eval"].rows
        if 0 < held_rows < self.global_batch_size:  # an eval split never read: refused, not silently skipped
            raise ParquetDataError(
                f"the eval split has {held_rows} rows, less than one global batch of {self.global_batch_size}, so it "
                "would never be evaluated; raise data.parquet.eval_fraction, give a larger eval_path, or lower "
                "data.global_batch_size"
            )
        for dataset in {id(d.dataset): d.dataset for d in self.splits.values()}.values():
            self._check_statistics(dataset)
        self.stream = Stream(self._window_refs(), self.global_batch_size, self.seed, cfg.shuffle, keyed=bool(self.key))
        self._identities: dict[str, dict] = {}
        evals = self.splits["eval"]
        self._eval_starts = np.concatenate([[0], np.cumsum([evals.dataset.row_groups[g].rows for g in evals.groups])])

    # time-ordered datasets and the recorded data position

    @property
    def key(self) -> str | None:
        """The partition key (data.parquet.periods.key), or None for an unpartitioned dataset."""
        return self.cfg.periods.key

    def _period_splits(self, train: Dataset) -> dict[str, Split]:
        """The training window and the evaluated periods of a dataset partitioned by time; each
        evaluated period also as its own split (`eval_periods`)."""
        key, periods_cfg = str(self.cfg.periods.key), self.cfg.periods
        self.group_periods = row_group_periods(train, key)
        found = ordered(self.group_periods)
        window = window_groups(self.group_periods, list(periods_cfg.train), list(periods_cfg.eval))
        held = window_groups(self.group_periods, list(periods_cfg.eval)) if periods_cfg.eval else []
        for name, bounds, chosen in (("train", periods_cfg.train, window), ("eval", periods_cfg.eval, held)):
            if not chosen and (bounds or name == "train"):
                raise ParquetDataError(
                    f"data.parquet.periods.{name} = {list(bounds)} selects no rows of {self.cfg.path}: its {key} "
                    f"periods are {found}; choose periods among them"
                )
        self.period_splits = {
            p: Split(train, [g for g in held if self.group_periods[g] == p])
            for p in ordered([self.group_periods[g] for g in held])
        }
        return {"train": Split(train, window), "eval": Split(train, held)}

    def _window_refs(self) -> list[GroupRef]:
        split = self.splits["train"]
        periods = getattr(self, "group_periods", None)
        return [
            GroupRef(g, split.dataset.paths[rg.file], rg.index, rg.rows, periods[g] if periods else "")
            for g in split.groups
            for rg in (split.dataset.row_groups[g],)
        ]

    @property
    def eval_periods(self) -> list[str]:
        """The evaluated periods in time order ([] for an unpartitioned dataset)."""
        return list(getattr(self, "period_splits", {}))

    def period_batches(self, period: str, rank: int, world_size: int) -> Iterator[Batch]:
        """This rank's slices of the global batches of evaluated period `period`, in order, one pass."""
        split = self.period_splits[period]
        b = self.global_batch_size // world_size
        reader = self._reader(split.dataset)
        starts = np.concatenate([[0], np.cumsum([split.dataset.row_groups[g].rows for g in split.groups])])
        for j in range(split.rows // self.global_batch_size):
            yield self.make_batch(*reader.read(split.groups, starts, j * self.global_batch_size + rank * b, b))

    def period_batch_count(self, period: str) -> int:
        """Global batches of evaluated period `period`."""
        return self.period_splits[period].rows // self.global_batch_size

    def _identity(self, path: str) -> dict:
        if path not in self._identities:
            self._identities[path] = file_identity(self.splits["train"].dataset.fs, path)
        return self._identities[path]

    def position(self, step: int) -> dict:
        """The data position after `step` global steps, as a checkpoint records it."""
        paths = {ref.path for ref in self.stream.groups}
        return self.stream.record(step, {p: self._identity(p) for p in paths}, self.key)

    def resume_position(self, record: dict | None, step: int, checkpoint: str) -> str | None:
        """Continue the train stream from the data position a checkpoint holds.

        The same stream where the window holds the same files, else the rows not read yet (new files
        whole).

        Args:
            record: the checkpoint's data position (`position`), or None.
            step: the global step the checkpoint was taken at.
            checkpoint: the checkpoint's name, for messages.

        Returns:
            A line describing a continuation over other files; None for an exact resume or no record.

        Raises:
            ParquetDataError: a recorded file changed or is gone.
        """
        if record is None:
            return None
        dataset = self.splits["train"].dataset
        recorded = {f["path"] for f in record.get("files", [])}
        identities = {p: self._identity(p) for p in dataset.paths if p in recorded}
        window = {ref.path for ref in self.stream.groups}
        bounds = list(self.cfg.periods.train)

        def in_window(period: str | None) -> bool:  # unpartitioned: every file is in the window
            return not self.key or (period is not None and (not bounds or in_range(period, bounds)))

        problem = changed_files(record, identities, window, in_window)
        if problem:
            raise ParquetDataError(
                f"{problem} (checkpoint {checkpoint}); a file a run has read must not change: restore it, or write "
                "new rows as new files (a new partition) and continue"
            )
        self.stream, continued = continued_stream(
            record, step, self.stream.groups, self.global_batch_size, self.seed, self.cfg.shuffle, bool(self.key)
        )
        if not continued:
            return None
        new = len(window - recorded)
        rows = int(self.stream.segments(0)[1][-1])
        files = f"{new} new file(s) in a window of {len(window)}"
        return f"data: continuing at step {step} on {rows:,} row(s) not read yet ({files})"

    @property
    def stream_start(self) -> int:
        """The global step of the stream's first batch: 0, or a continuation over new data's first step."""
        return self.stream.base_step

    def steps_for_passes(self, passes: int) -> int:
        """The global step at which `passes` passes over the window end (the first continues the
        current one: its rows not read yet)."""
        return self.stream.steps_for_passes(passes)

    def _check_statistics(self, dataset: Dataset) -> None:
        """Read and check as a batch each row group whose Parquet statistics show nulls,
        ids outside [0, rows) (id_policy=refuse) or labels outside [0, 1] in a one-id or label column,
        or nulls or negative values in the sample-weight column."""
        bounds: dict[str, tuple[float, float]] = {c: (0, 1) for c in self.cfg.labels}
        if self.cfg.id_policy == IdPolicy.refuse:
            bounds |= {
                s.column or s.name: (0, r - 1) for (_, s), r in zip(self.maker.specs, self.table_rows, strict=True)
            }
        checked = {s.column or s.name for _, s in self.maker.specs if s.kind == SparseKind.id} | set(self.cfg.labels)
        if self.cfg.weight:  # nulls and negative sample weights
            bounds[self.cfg.weight] = (0, float("inf"))
            checked.add(self.cfg.weight)
        reader = self._reader(dataset)
        for g, rg in enumerate(dataset.row_groups):
            meta = dataset.metadata[rg.file].row_group(rg.index)
            for j in range(meta.num_columns):
                chunk = meta.column(j)
                stats = chunk.statistics
                if chunk.path_in_schema not in checked or stats is None:
                    continue
                lo, hi = bounds.get(chunk.path_in_schema, (None, None))
                nulls = stats.has_null_count and stats.null_count > 0
                outside = stats.has_min_max and lo is not None and (stats.min < lo or stats.max > hi)
                if nulls or outside:
                    self.make_batch(reader.group(g), [(0, dataset.paths[rg.file], rg.first_row)])  # names the row

    def num_batches(self, split: str) -> int:
        """Global batches per epoch of `split` (train or eval); the last partial batch is dropped."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use one of {SPLITS}")
        return self.splits[split].rows // self.global_batch_size

    def group_order(self, split: str, epoch: int) -> list[int]:
        """The split's row groups in the order of `epoch`: seeded by (seed, epoch) for shuffled train
        (within each period of a dataset partitioned by time)."""
        if split == "train":
            return [ref.group for ref in self.stream.order(epoch)]
        return list(self.splits[split].groups)

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> OrderedWorkers[Batch]:
        """This rank's slices of global batches start_step, start_step + 1, ... in order.

        Train is endless, eval one pass; batches are made on `reader_workers` background threads.

        Raises:
            ValueError: the global batch size is not divisible by `world_size`, or `rank` is outside it.
        """
        n = self.num_batches(split)  # checks the split's name
        if self.global_batch_size % world_size or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank} of world size {world_size}: data.global_batch_size={self.global_batch_size} "
                f"must be divisible by the world size, and 0 <= rank < world size"
            )
        b, workers = self.global_batch_size // world_size, self.reader_workers(world_size)
        reader = self._reader(self.splits[split].dataset).share(workers)
        stop = None if split == "train" else n
        make = functools.partial(self._batch_at, split, reader, rank * b, b)
        return OrderedWorkers(make, start_step, stop, workers, max(1, self.cfg.prefetch_batches))

    def reader_workers(self, world_size: int) -> int:
        """Threads making one rank's batches: data.parquet.reader_workers, or for 0 min(4, the cores per
        rank of this node (LOCAL_WORLD_SIZE ranks, else `world_size`))."""
        if self.cfg.reader_workers > 0:
            return int(self.cfg.reader_workers)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        return max(1, min(4, cores // max(1, local)))

    def rows_in_order(self, batch_size: int, max_rows: int | None = None) -> Iterator[Batch]:
        """Every row of the train split (or its first `max_rows`) in file order, `batch_size` at a time,
        the last batch partial; checked as training's batches are."""
        split = self.splits["train"]
        n = split.rows if max_rows is None else min(max_rows, split.rows)
        reader = self._reader(split.dataset)
        starts = np.concatenate([[0], np.cumsum([split.dataset.row_groups[g].rows for g in split.groups])])
        for start in range(0, n, batch_size):
            yield self.make_batch(*reader.read(split.groups, starts, start, min(batch_size, n - start)))

    def _reader(self, dataset: Dataset) -> RowGroupReader:
        """A reader of `dataset`'s declared columns, each row group prepared once (`BatchMaker.prepare`)."""
        return RowGroupReader(dataset, self.columns, self.maker.prepare)

    def _batch_at(self, split: str, reader: RowGroupReader, offset: int, count: int, step: int) -> Batch:
        """Rows [offset, offset + count) of global batch `step` of `split` (train: of the stream)."""
        if split == "eval":
            groups = self.splits["eval"].groups
            return self.make_batch(
                *reader.read(groups, self._eval_starts, step * self.global_batch_size + offset, count)
            )
        dataset = self.splits["train"].dataset
        pieces, origin, at = [], [], 0
        for g, a, n in self.stream.slices(step, offset, count):
            rg = dataset.row_groups[g]
            pieces.append(reader.group(g).slice(a, n))
            origin.append((at, dataset.paths[rg.file], rg.first_row + a))
            at += n
        return self.make_batch(pa.concat_tables(pieces).combine_chunks(), origin)

    def make_batch(self, table, origin: list[tuple]) -> Batch:
        """A Batch of this source's declared columns; with data.parquet.weight a `WeightedBatch` (its
        rows' sample weights, checked)."""
        batch = self.maker.make_batch(table, origin)
        if not self.cfg.weight:
            return batch
        import torch

        from dlrm.data.weighted_batch import with_weights

        return with_weights(batch, torch.from_numpy(sample_weights(table, self.cfg.weight, origin)))

    def data_counts(self) -> dict[str, int]:
        """Values this process's reads changed: ids folded by id_policy=modulo, dense values read as
        missing by nonfinite=replace."""
        return {"folded_ids": self.maker.folded_ids, "nonfinite_values": self.maker.nonfinite_values}

    @property
    def folded_ids(self) -> int:
        """Ids folded into their table by id_policy=modulo so far."""
        return self.maker.folded_ids
