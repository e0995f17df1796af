"""Sharding: per-table constraints from config, TorchRec's planner, DistributedModelParallel.

DMP shards the embedding tables (lookups travel by alltoall; row-wise shards by
reduce-scatter/allgather) and wraps the dense layers in DDP (gradients are allreduced).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.proposers import UniformProposer
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Proposer, Topology
from torchrec.distributed.types import (
    CacheParams,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ParameterSharding,
    QuantizedCommCodecs,
    ShardingEnv,
    ShardingPlan,
)

from dlrm.config import ROW_SPLIT, Config, ModelConfig, ShardingConfig, TableConfig
from dlrm.config.choices import ShardingType
from dlrm.distributed.capacity import planner_refusal
from dlrm.distributed.plan_records import Shard, TablePlan


class AnyDeviceEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder offering every sharding type on every device.

    TorchRec offers row_wise, table_row_wise and grid_shard only on CUDA, although they run and are exact
    on CPU with Gloo; this sharder offers the CUDA list everywhere.
    """

    def __init__(self, *args, replicate: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.replicate = replicate

    def sharding_types(self, compute_device_type: str) -> list[str]:
        types = super().sharding_types("cuda")
        return types if self.replicate else [t for t in types if t != "data_parallel"]


COMM_TYPES = {"fp32": CommType.FP32, "fp16": CommType.FP16, "bf16": CommType.BF16}


# fbgemm 1.8's backward_loss_scale divides before the fp16 cast (docs/design/library-workarounds.md);
# tests/distributed/test_precision_options.py shows both.
class LossScaledCodec:
    """A quantized-comms codec that scales its input by `scale` before encoding and divides after decoding.

    Both in the input's precision (fp32); dtype, sizes and context are the wrapped codec's. Used instead of
    fbgemm's own backward loss scale, which divides before casting back.
    """

    def __init__(self, codec: Any, scale: float) -> None:
        self.codec, self.scale = codec, scale

    def encode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        return self.codec.encode(input_tensor * self.scale, ctx)

    def decode(self, input_tensor: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        return self.codec.decode(input_tensor, ctx) / self.scale

    def __getattr__(self, name: str) -> Any:  # quantized_dtype, calc_quantized_size, create_context, ...
        return getattr(self.codec, name)


def qcomms_registry(cfg: ShardingConfig, device_type: str) -> dict[str, QuantizedCommCodecs] | None:
    """TorchRec's quantized-comms codecs for sharding.qcomms_forward/backward on `device_type`
    (the alltoalls and reduce-scatters of pooled embeddings and of their gradients), fp16 gradients
    scaled by sharding.qcomms_backward_loss_scale around the wire (`LossScaledCodec`); None when both
    are fp32."""
    qcomms = QCommsConfig(
        forward_precision=COMM_TYPES[cfg.qcomms_forward], backward_precision=COMM_TYPES[cfg.qcomms_backward]
    )
    registry = get_qcomm_codecs_registry(qcomms, device=torch.device(device_type))
    scale = cfg.qcomms_backward_loss_scale
    if registry is None or cfg.qcomms_backward != "fp16" or scale is None:
        return registry
    return {
        op: QuantizedCommCodecs(forward=c.forward, backward=cast(Any, LossScaledCodec(c.backward, scale)))
        for op, c in registry.items()
    }


def sharders(cfg: Config | None = None) -> list[ModuleSharder[torch.nn.Module]]:
    """The sharders of the planner and of DMP (TorchRec types them for any module), with the
    quantized-comms codecs of `cfg.sharding` (None: fp32 comms).

    Tables in fp16/bf16 (model.embedding_precision) are never replicated: fbgemm's fused kernels
    keep their optimizer state in fp32, but a data-parallel table is trained by a torch optimizer on
    the half-precision weights themselves (Adagrad's eps and state underflow: NaN).
    """
    registry = qcomms_registry(cfg.sharding, cfg.topology.device) if cfg is not None else None
    full_precision = cfg is None or cfg.model.embedding_precision == "fp32"
    sharder = AnyDeviceEmbeddingBagCollectionSharder(qcomm_codecs_registry=registry, replicate=full_precision)
    return [cast(ModuleSharder[torch.nn.Module], sharder)]


def table_sharding(cfg: ShardingConfig, model: ModelConfig) -> dict[str, str | None]:
    """Each table's pinned sharding type (None: the planner chooses). See ShardingConfig."""
    return {t.name: cfg.pinned(t) for t in model.tables}


def constraints(cfg: Config, world_size: int) -> dict[str, ParameterConstraints]:
    """Planner constraints per table: its sharding type, pooling factor, and sharding.compute_kernel,
    cache_load_factor and prefetch_pipeline (the UVM cache's TorchRec CacheParams).

    The type is the pinned one; else, on one rank, table_wise: every type keeps the whole table on
    that rank, and table-wise does the least work per step (TorchRec's planner picks row_wise there,
    which bucketizes every id for nothing); else the planner chooses (`auto_types`; on CPU among
    GLOO_AUTO_TYPES, one type for every table: `uniform_on_gloo`).
    """
    pinned = table_sharding(cfg.sharding, cfg.model)
    single = ["table_wise"] if world_size == 1 else None
    sh = cfg.sharding
    kernel = None if sh.compute_kernel == "auto" else [str(sh.compute_kernel)]
    cache = (
        CacheParams(load_factor=sh.cache_load_factor, prefetch_pipeline=sh.prefetch_pipeline or None)
        if sh.cache_load_factor is not None or sh.prefetch_pipeline
        else None
    )
    return {
        t.name: ParameterConstraints(
            sharding_types=[str(kind)] if (kind := pinned[t.name]) else single or auto_types(cfg, t),
            compute_kernels=None if kind == "data_parallel" else kernel,  # replicated tables: the dense kernel
            pooling_factors=[float(t.pooling)] * len(t.features),
            cache_params=cache,
        )
        for t in cfg.model.tables
    }


def auto_types(cfg: Config, table: TableConfig) -> list[str] | None:
    """The types the planner may choose for an unpinned table (None: any the sharder offers).

    On CPU (Gloo) `GLOO_AUTO_TYPES`; else any but, for a mean-pooled table, those that split its rows
    (`ROW_SPLIT`). Pinned types (sharding.strategy, per_table) may be any.
    """
    if str(cfg.topology.device) == "cpu":
        return [str(kind) for kind in GLOO_AUTO_TYPES]
    if table.pooling_type != "mean":
        return None
    return [str(kind) for kind in ShardingType if kind not in ROW_SPLIT]


# On Gloo, `auto` plans every table alike (TorchRec's UniformProposer), replicated, table- or column-wise:
# the types whose exchange is one alltoall each way. TorchRec's estimator prices bytes only, so its other
# picks ran slower on Gloo (docs/design/planning.md, "Sharding types on Gloo").
GLOO_AUTO_TYPES = (ShardingType.data_parallel, ShardingType.table_wise, ShardingType.column_wise)


# Sharding types in the order a tie between uniform plans goes: TorchRec's enumerator lists a constrained
# table's types in set order (`set(constrained) & set(allowed)`), which Python's string hashing varies
# from process to process, and its planner keeps the first of equally rated plans. A table no wider than
# TorchRec's column shard is one column-wise shard on one rank, placed and moved as table-wise: the two
# rate alike, and `auto` planned either by chance (dlrm_small, dlrm_wide). Table-wise first: the same
# work, without the column-shard bookkeeping.
TIE_ORDER = ("table_wise", "column_wise", "data_parallel", "table_column_wise", "row_wise", "table_row_wise")


class OrderedUniformProposer(UniformProposer):
    """TorchRec's UniformProposer over a search space in a fixed order of sharding types (`TIE_ORDER`),
    each table's options otherwise as enumerated: the same plan in every process."""

    def load(self, search_space, enumerator=None) -> None:
        rank = {kind: i for i, kind in enumerate(TIE_ORDER)}
        super().load(sorted(search_space, key=lambda o: rank.get(o.sharding_type, len(rank))), enumerator)


def uniform_on_gloo(cfg: Config) -> bool:
    """Whether `auto` plans every table alike (see GLOO_AUTO_TYPES): on CPU, with no table pinned."""
    pinned = table_sharding(cfg.sharding, cfg.model)
    return str(cfg.topology.device) == "cpu" and not any(pinned.values())


def make_planner(cfg: Config, topology: Topology, proposer: Proposer | None = None) -> EmbeddingShardingPlanner:
    """TorchRec's planner for this topology, with per-rank batch size and table constraints.

    Args:
        cfg: the run's config.
        topology: TorchRec's planner Topology.
        proposer: one TorchRec proposer instead of its default four (faster with 100+ ranks; the plan may
            differ). None: the default four, or TorchRec's UniformProposer where `uniform_on_gloo`.
    """
    if proposer is None and uniform_on_gloo(cfg):
        proposer = OrderedUniformProposer()
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.data.global_batch_size // topology.world_size,
        constraints=constraints(cfg, topology.world_size),
        proposer=proposer,
    )


def plan_sharding(
    cfg: Config,
    model: torch.nn.Module,
    topology: Topology,
    pg: dist.ProcessGroup | None,
    proposer: Proposer | None = None,
) -> ShardingPlan:
    """TorchRec's sharding plan: made on rank 0 and broadcast over `pg`, or made locally when `pg` is None.

    Raises:
        PlanError: TorchRec's planner finds no plan.
    """
    planner = make_planner(cfg, topology, proposer)
    module_sharders = sharders(cfg)
    try:
        if pg is None:
            return planner.plan(model, module_sharders)
        return planner.collective_plan(model, module_sharders, pg)
    except PlannerError as e:  # a user error: the config asks for more than the topology holds
        raise planner_refusal(cfg, topology.world_size, e) from e


def shard_model(
    cfg: Config, model: torch.nn.Module, plan: ShardingPlan, pg: dist.ProcessGroup, device: torch.device
) -> DistributedModelParallel:
    """Distribute `model` (built on meta) by `plan`: sharded tables plus DDP-wrapped dense layers.

    The tables are materialised on `device` directly, in model.embedding_precision, and their collectives
    use the qcomms codecs of `cfg.sharding`.

    Returns:
        The DistributedModelParallel.
    """
    return DistributedModelParallel(
        module=model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=sharders(cfg),
    )


def _parameter_plans(plan: ShardingPlan) -> Iterator[tuple[str, ParameterSharding]]:
    """(table name, its ParameterSharding) of every sharded module of `plan`."""
    for module_plan in plan.plan.values():
        yield from cast(EmbeddingModuleShardingPlan, module_plan).items()


def describe_plan(plan: ShardingPlan) -> list[dict]:
    """One dict per table: name, sharding type, compute kernel, ranks holding it."""
    return [
        {
            "table": table,
            "sharding_type": ps.sharding_type,
            "compute_kernel": ps.compute_kernel,
            "ranks": list(ps.ranks or []),
        }
        for table, ps in _parameter_plans(plan)
    ]


def table_plans(plan: ShardingPlan, model: ModelConfig, world_size: int) -> list[TablePlan]:
    """The plan of every table of `model`, in config order, as torch-free `TablePlan` records."""
    by_name = dict(_parameter_plans(plan))
    out = []
    for t in model.tables:
        ps = by_name[t.name]
        if ps.sharding_spec is None:  # data_parallel: a full replica on every rank
            shards = [Shard(r, 0, 0, t.rows, t.dim) for r in (ps.ranks or range(world_size))]
        else:
            spec: Any = ps.sharding_spec  # TorchRec's plans hold an EnumerableShardingSpec: its ShardMetadata list
            shards = [Shard(md.placement.rank(), *md.shard_offsets, *md.shard_sizes) for md in spec.shards]
        out.append(
            TablePlan(
                table=t.name,
                rows=t.rows,
                dim=t.dim,
                features=len(t.features),
                pooling=t.pooling,
                sharding_type=ps.sharding_type,
                compute_kernel=ps.compute_kernel,
                cache_load_factor=getattr(ps.cache_params, "load_factor", None),
                ranks=sorted({s.rank for s in shards}),
                shards=shards,
            )
        )
    return out
