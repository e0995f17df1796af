"""The sharding section: how the embedding tables are placed on the ranks, and their kernels and comms."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm.config.checks import _fail, _require_positive
from dlrm.config.choices import ComputeKernel, Precision, ShardingStrategy, ShardingType
from dlrm.config.model import TableConfig


@dataclass
class ShardingConfig:
    """How tables are sharded. Precedence for a table: sharding.per_table[name], then the table's own
    `sharding`, then `strategy`."""

    strategy: ShardingStrategy = ShardingStrategy.auto
    """The sharding type of every table not pinned otherwise; `auto` lets TorchRec's planner choose
    (on one rank: table_wise; on CPU one of data_parallel, table_wise, column_wise for every table;
    on GPUs any type per table)."""
    per_table: dict[str, ShardingType] = field(default_factory=dict)
    """{table name: sharding type}: overrides both the table's own `sharding` and `strategy`."""
    qcomms_forward: Precision = Precision.fp32
    """The wire precision (fp32, fp16, bf16) of the sharded tables' forward collectives (the pooled
    embeddings' alltoall and reduce-scatter): TorchRec's quantized comms (QCommsConfig). The planner's
    communication estimates and DMP's sharders both get the codecs. TorchRec turns bf16 into fp16 on
    Gloo, so on CPU use fp32 or fp16."""
    qcomms_backward: Precision = Precision.fp32
    """The wire precision (fp32, fp16, bf16) of the same collectives' gradients in the backward pass;
    as qcomms_forward otherwise."""
    qcomms_backward_loss_scale: float | None = 1024.0
    """With qcomms_backward=fp16: the gradients are multiplied by this before the cast to fp16 and divided
    by it after (TorchRec's QCommsConfig.backward_loss_scale). The pooled embeddings' gradients of a mean
    loss are small (about 1e-7..1e-4 at a few thousand samples per rank), under fp16's smallest normal
    (6.1e-5), where fp16 keeps few bits or none; 1024 lifts every gradient above 6e-8 into its normal
    range, and only a gradient over 64 would overflow. A power of two scales exactly. null: no scaling.
    bf16 has fp32's exponent range and is not scaled."""
    compute_kernel: ComputeKernel = ComputeKernel.auto
    """The sharded tables' kernel (dlrm.config.choices.ComputeKernel); on a GPU, fused_uvm_caching keeps the
    tables (and their optimizer state) in host memory with a cache of `cache_load_factor` of each
    table's rows in HBM, the Zion design of large host memory beside the accelerators; auto lets the
    planner offload only what HBM cannot hold."""
    cache_load_factor: float | None = None
    """The fraction in (0, 1] of each table's rows the UVM cache holds in HBM (compute_kernel
    fused_uvm_caching or auto); None: TorchRec's 0.2."""
    prefetch_pipeline: bool = False
    """TorchRec's PrefetchTrainPipelineSparseDist, which fills the cache for the next batch on its own
    CUDA stream while this one trains (GPU, UVM caching, trainer.pipeline=true)."""

    def check(self, tables: list[str], key: str = "sharding") -> None:
        if self.qcomms_backward_loss_scale is not None:
            _require_positive(f"{key}.qcomms_backward_loss_scale", self.qcomms_backward_loss_scale)
        for name, kind in self.per_table.items():
            if name not in tables:
                _fail(f"{key}.per_table.{name}", kind, f"no table of that name; tables: {', '.join(sorted(tables))}")
        if self.cache_load_factor is not None:
            if not 0 < self.cache_load_factor <= 1:  # `not <` also catches nan
                _fail(f"{key}.cache_load_factor", self.cache_load_factor, "give a fraction in (0, 1], e.g. 0.2")
            if self.compute_kernel not in (ComputeKernel.auto, ComputeKernel.fused_uvm_caching):
                _fail(
                    f"{key}.cache_load_factor",
                    self.cache_load_factor,
                    f"sharding.compute_kernel={self.compute_kernel} has no cache: use fused_uvm_caching (or auto)",
                )

    def check_device(self, device: str, pipeline: bool, key: str = "sharding") -> None:
        """The UVM kernels and the cache prefetch need a GPU (and the prefetch, the pipeline)."""
        uvm = self.compute_kernel in (ComputeKernel.fused_uvm, ComputeKernel.fused_uvm_caching)
        if device != "cuda" and uvm:
            _fail(
                f"{key}.compute_kernel",
                self.compute_kernel,
                "fbgemm's UVM kernels keep a GPU's tables in host memory; on CPU every table is in host "
                "memory already: use auto or fused",
            )
        if self.prefetch_pipeline:
            if device != "cuda":
                _fail(f"{key}.prefetch_pipeline", True, "the cache prefetch runs on a CUDA stream: GPU topologies only")
            if self.compute_kernel not in (ComputeKernel.auto, ComputeKernel.fused_uvm_caching):
                _fail(
                    f"{key}.prefetch_pipeline",
                    True,
                    "it prefetches into the UVM cache: use compute_kernel=fused_uvm_caching",
                )
            if not pipeline:
                _fail(
                    f"{key}.prefetch_pipeline",
                    True,
                    "it is a stage of the training pipeline: set trainer.pipeline=true",
                )

    def pinned(self, table: TableConfig) -> ShardingType | None:
        """The table's sharding type by the precedence above, or None: the planner chooses."""
        kind = self.per_table.get(table.name) or table.sharding or self.strategy
        return None if kind == ShardingStrategy.auto else ShardingType(kind)
