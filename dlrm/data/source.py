"""The interface of batch sources (`BatchSource`), and the one `data.source` names (`make_source`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dlrm.config import Config

if TYPE_CHECKING:
    import torch
    from torchrec.datasets.utils import Batch


class BatchSource(Protocol):
    """Where training and evaluation batches come from, the same global batches on any world size.

    Global batch k of a split is fixed by the config and the seed; rank r of W takes samples
    [r * B / W, (r + 1) * B / W) of it (B = data.global_batch_size).
    """

    def num_batches(self, split: str) -> int | None:
        """Global batches in `split` ("train" or "eval"); None: endless."""
        ...

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> Iterator[Batch]:
        """This rank's slice of global batches start_step, start_step + 1, ... of `split`.

        Each is a Batch of dense [b, N] float, sparse KeyedJaggedTensor, labels [b] (or [b, T] with T
        label columns), b = B / W.
        """
        ...


@runtime_checkable
class PositionedSource(Protocol):
    """A source whose data position is recorded, not derived from the step: what a checkpoint holds of
    it, the continuation from it, passes over a training window, and evaluated periods of a dataset
    partitioned by time."""

    @property
    def eval_periods(self) -> list[str]:
        """The evaluated periods in time order ([] without periods)."""
        ...

    @property
    def stream_start(self) -> int:
        """The global step of the current stream's first batch (a continuation over new data's)."""
        ...

    def position(self, step: int) -> dict:
        """The checkpoint's `data_position` after `step` global steps."""
        ...

    def resume_position(self, record: dict | None, step: int, checkpoint: str) -> str | None:
        """Continue from a checkpoint's record at `step`; a line describing a continuation, or None."""
        ...

    def steps_for_passes(self, passes: int) -> int:
        """The global step at which `passes` passes over the training window end."""
        ...

    def period_batches(self, period: str, rank: int, world_size: int) -> Iterator[Batch]:
        """This rank's slices of the global batches of evaluated period `period`, one pass."""
        ...

    def period_batch_count(self, period: str) -> int:
        """Global batches of evaluated period `period`."""
        ...


def feature_layout(cfg: Config) -> tuple[list[str], list[int], list[int]]:
    """(feature names in KJT key order, rows of each feature's table, ids per sample of each feature:
    the whole number the synthetic and multi-hot sources draw)."""
    names, rows, pooling = [], [], []
    for t in cfg.model.tables:
        for f in t.features:
            names.append(f)
            rows.append(t.rows)
            pooling.append(int(t.pooling))
    return names, rows, pooling


RAW_ID_BOUND = (1 << 63) - 1  # ids of a table with a managed vocabulary: any int64 below it (the model maps them)


def id_bounds(cfg: Config) -> list[int]:
    """Per feature (KJT key order) the bound its ids must lie below as read: its table's rows, or
    RAW_ID_BOUND for a table with a managed vocabulary (model.tables[*].vocabulary: raw ids, strings
    hashed to 63 bits), which the model maps to rows."""
    return [RAW_ID_BOUND if t.vocabulary.managed else t.rows for t in cfg.model.tables for _ in t.features]


def batches_on(source: BatchSource, device: torch.device) -> bool:
    """Whether `source` makes its batches on `device` already (a source may say where it makes them
    in a `device` attribute; without one, its batches are in host memory)."""
    import torch

    made = getattr(source, "device", None)
    return made is not None and torch.device(made) == device


def make_source(cfg: Config, device: torch.device | None = None) -> BatchSource:
    """The batch source `data.source` names: synthetic, preprocessed Criteo or Parquet files.

    Args:
        cfg: the whole config (data, model tables and seed).
        device: the training device; None: the host. Synthetic batches are made on it unless
            data.synthetic.on_device=false; Criteo's and Parquet's multi-hot ids are expanded on it
            when it is a GPU (`BaseIdBatch`).
    """
    names, rows, pooling = feature_layout(cfg)
    bounds = id_bounds(cfg)  # files hold raw ids; synthetic ids are drawn below the table's rows
    on_gpu = device is not None and device.type == "cuda"  # multi-hot ids expand there
    if cfg.data.source == "criteo":
        from dlrm.data.criteo.loader import CriteoSource

        return CriteoSource(
            cfg.data.criteo, names, bounds, cfg.data.global_batch_size, cfg.seed, device if on_gpu else None
        )
    if cfg.data.source == "parquet":
        from dlrm.data.parquet.source import ParquetSource

        return ParquetSource(
            cfg.data.parquet, names, bounds, cfg.data.global_batch_size, cfg.seed, device if on_gpu else None
        )
    from dlrm.data.synthetic import SyntheticSource

    return SyntheticSource(
        cfg.data.synthetic,
        feature_names=names,
        table_rows=rows,
        pooling=pooling,
        dense_features=cfg.model.dense_in_features,
        global_batch_size=cfg.data.global_batch_size,
        seed=cfg.seed,
        eval_batches=cfg.data.eval_batches,
        device=device if cfg.data.synthetic.on_device else None,
        tasks=len(cfg.model.tasks),
    )
