"""The choices a config offers, as enums: OmegaConf refuses any other value while composing.

StrEnum members are strings: they compare equal to their values, print and serialise as them.
"""

from __future__ import annotations

from enum import StrEnum


class ShardingType(StrEnum):
    """How TorchRec places one table (see README: every type runs on CPU and on GPU here)."""

    table_wise = "table_wise"
    row_wise = "row_wise"
    column_wise = "column_wise"
    table_row_wise = "table_row_wise"
    table_column_wise = "table_column_wise"
    grid_shard = "grid_shard"
    data_parallel = "data_parallel"


class ShardingStrategy(StrEnum):
    """`auto` (TorchRec's planner chooses per table) or one ShardingType for every table."""

    auto = "auto"
    table_wise = "table_wise"
    row_wise = "row_wise"
    column_wise = "column_wise"
    table_row_wise = "table_row_wise"
    table_column_wise = "table_column_wise"
    grid_shard = "grid_shard"
    data_parallel = "data_parallel"


class Interaction(StrEnum):
    dot = "dot"
    dcn = "dcn"


class EmbeddingOptimizer(StrEnum):
    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"
    adam = "adam"


class DenseOptimizer(StrEnum):
    sgd = "sgd"
    adagrad = "adagrad"
    adam = "adam"


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


class Backend(StrEnum):
    """`auto`: NCCL on cuda, Gloo on cpu."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class Fabric(StrEnum):
    """How the ranks of one level are wired (the cost model's formulas: dlrm.comms.costmodel)."""

    ring = "ring"
    fully_connected = "fully_connected"
    switch = "switch"


class DataSource(StrEnum):
    synthetic = "synthetic"
    criteo = "criteo"


class ProgressMode(StrEnum):
    """auto: a bar on a terminal, lines otherwise."""

    auto = "auto"
    bar = "bar"
    lines = "lines"
    none = "none"


class DenseAllreduce(StrEnum):
    flat = "flat"
    hierarchical = "hierarchical"


class DensePrecision(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


class OnNonfinite(StrEnum):
    stop = "stop"
    skip = "skip"
