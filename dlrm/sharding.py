"""Sharding: per-table constraints from config, TorchRec's planner, DistributedModelParallel.

DMP shards the embedding tables (lookups travel by alltoall; row-wise shards by
reduce-scatter/allgather) and wraps the dense layers in DDP (gradients are allreduced).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import ParameterConstraints, PlannerError, Topology
from torchrec.distributed.types import ShardingEnv, ShardingPlan

from dlrm.config import Config, ShardingConfig, ModelConfig
from dlrm.plan import planner_refusal


class AnyDeviceEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder offering every sharding type on every device.

    TorchRec offers row_wise, table_row_wise and grid_shard only on CUDA, although they run and
    are numerically right on CPU with Gloo (our distributed tests check it against an unsharded
    model). This sharder offers the CUDA list everywhere, so CPU runs can use and test them.
    """

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return super().sharding_types("cuda")


def table_sharding(cfg: ShardingConfig, model: ModelConfig) -> Dict[str, Optional[str]]:
    """Each table's pinned sharding type (None: the planner chooses). See ShardingConfig."""
    default = None if cfg.strategy == "auto" else cfg.strategy
    return {t.name: cfg.per_table.get(t.name) or t.sharding or default for t in model.tables}


def constraints(cfg: Config) -> Dict[str, ParameterConstraints]:
    """Planner constraints per table: its sharding type (if pinned) and pooling factor."""
    pinned = table_sharding(cfg.sharding, cfg.model)
    return {
        t.name: ParameterConstraints(
            sharding_types=[pinned[t.name]] if pinned[t.name] else None,
            pooling_factors=[float(t.pooling)] * len(t.features),
        )
        for t in cfg.model.tables
    }


def make_planner(cfg: Config, topology: Topology) -> EmbeddingShardingPlanner:
    """TorchRec's planner for this topology, with per-rank batch size and table constraints."""
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.data.global_batch_size // topology.world_size,
        constraints=constraints(cfg),
    )


def plan_sharding(
    cfg: Config, model: torch.nn.Module, topology: Topology, pg: Optional[dist.ProcessGroup]
) -> ShardingPlan:
    """Plan on rank 0 and broadcast (pg given), or plan locally (pg None: no process group needed).

    Raises PlanError (a UserError) when TorchRec's planner finds no plan.
    """
    planner = make_planner(cfg, topology)
    sharders = [AnyDeviceEmbeddingBagCollectionSharder()]
    try:
        if pg is None:
            return planner.plan(model, sharders)
        return planner.collective_plan(model, sharders, pg)
    except PlannerError as e:  # a user error: the config asks for more than the topology holds
        raise planner_refusal(cfg, topology.world_size, e) from e


def shard_model(
    model: torch.nn.Module, plan: ShardingPlan, pg: dist.ProcessGroup, device: torch.device
) -> DistributedModelParallel:
    """Distribute `model` (built on meta) by `plan`: sharded tables plus DDP-wrapped dense layers."""
    return DistributedModelParallel(
        module=model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=[AnyDeviceEmbeddingBagCollectionSharder()],
    )


def describe_plan(plan: ShardingPlan) -> List[dict]:
    """One dict per table: name, sharding type, compute kernel, ranks holding it."""
    rows = []
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            rows.append(
                {
                    "table": table,
                    "sharding_type": ps.sharding_type,
                    "compute_kernel": ps.compute_kernel,
                    "ranks": list(ps.ranks or []),
                }
            )
    return rows
