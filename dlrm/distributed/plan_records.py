"""Where a sharding plan puts each table: plain, torch-free records for the tools that analyse a plan
(memory, traffic, reports, projections) without importing TorchRec.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shard:
    """One block of a table on one rank: rows [row_offset, row_offset + rows), cols likewise."""

    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int


@dataclass(frozen=True)
class TablePlan:
    """Where one table lives in a sharding plan, for analysis (memory, traffic, reports).

    features: how many features look it up; pooling: mean ids per sample per feature; ranks: those holding
    a shard; shards: every block (data_parallel: one full replica per rank).
    """

    table: str
    rows: int
    dim: int
    features: int
    pooling: float
    sharding_type: str
    compute_kernel: str
    cache_load_factor: float | None
    ranks: list[int]
    shards: list[Shard] = field(default_factory=list)
