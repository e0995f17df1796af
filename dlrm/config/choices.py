"""The choices a config offers, as enums: OmegaConf refuses any other value while composing.

StrEnum members are strings: they compare equal to their values, print and serialise as them.
Each enum is written `StrEnum(name, "member member ...")` (a member's value is its name), or as a
class where it carries more than its values (`Precision.itemsize`).
"""

from __future__ import annotations

from enum import StrEnum

# How TorchRec places one table (every type runs on CPU and on GPU here: see docs/configuration.md).
ShardingType = StrEnum(
    "ShardingType", "table_wise row_wise column_wise table_row_wise table_column_wise grid_shard data_parallel"
)
# `auto` (TorchRec's planner chooses per table) or one ShardingType for every table.
ShardingStrategy = StrEnum(
    "ShardingStrategy", "auto table_wise row_wise column_wise table_row_wise table_column_wise grid_shard data_parallel"
)
# The compute kernel of the sharded tables (fbgemm's TBE): auto (the planner chooses: fused in HBM when
# the tables fit), fused (HBM on a GPU, host memory on CPU), fused_uvm_caching (host memory with a
# cache of rows in HBM), fused_uvm (host memory, read over UVM). Data-parallel tables use `dense`.
ComputeKernel = StrEnum("ComputeKernel", "auto fused fused_uvm_caching fused_uvm")
Interaction = StrEnum("Interaction", "dot dcn")
# How a bag of ids becomes one vector: TorchRec's PoolingType (sum or mean of the rows).
PoolingType = StrEnum("PoolingType", "sum mean")
EmbeddingOptimizer = StrEnum("EmbeddingOptimizer", "rowwise_adagrad adagrad sgd adam")
DenseOptimizer = StrEnum("DenseOptimizer", "sgd adagrad adam")
Device = StrEnum("Device", "cpu cuda")
Backend = StrEnum("Backend", "auto gloo nccl")  # auto: NCCL on cuda, Gloo on cpu
# How the ranks of one level are wired (the cost model's formulas: dlrm.comms.costmodel).
Fabric = StrEnum("Fabric", "ring fully_connected switch")
DataSource = StrEnum("DataSource", "synthetic criteo parquet")
# How a Parquet column gives a sparse feature its ids: id (an int column, one id per sample), ids
# (list<int>: any number per sample), string (a string column, hashed), strings (list<string>, hashed).
SparseKind = StrEnum("SparseKind", "id ids string strings")
# An id outside [0, table rows) in a Parquet column: refuse (one error line) or modulo (folded, counted).
IdPolicy = StrEnum("IdPolicy", "refuse modulo")
# A table's managed vocabulary (TorchRec's managed-collision eviction policies); none: ids index the table directly.
VocabularyPolicy = StrEnum("VocabularyPolicy", "none lru lfu distance_lfu")
# A NaN or infinite dense value in a Parquet column: refuse (one error line) or replace (read as missing, counted).
NonFinitePolicy = StrEnum("NonFinitePolicy", "refuse replace")
ProgressMode = StrEnum("ProgressMode", "auto bar lines none")  # auto: a bar on a terminal, lines otherwise
DenseAllreduce = StrEnum("DenseAllreduce", "flat hierarchical")
DenseSync = StrEnum("DenseSync", "allreduce local_sgd")  # local_sgd: average the dense weights every H steps
DensePrecision = StrEnum("DensePrecision", "fp32 bf16")
# Whose fp32 products the MLPs use on the CPU: auto (oneDNN where MKL would run short of the CPU's ISA), mkl, onednn.
CpuGemm = StrEnum("CpuGemm", "auto mkl onednn")


class Precision(StrEnum):
    """A storage or wire format: table weights (model.embedding_precision), the embedding alltoall /
    reduce-scatter (sharding.qcomms_forward/backward), the dense allreduce (trainer.dense_allreduce_precision)."""

    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 4 if self is Precision.fp32 else 2


OnNonfinite = StrEnum("OnNonfinite", "stop skip")
OnNewData = StrEnum("OnNewData", "continue restart")
