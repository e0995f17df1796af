"""Per-rank memory of a sharding plan: HBM and host DDR, by part, against the topology's capacity.

`memory_summary` counts every shard where its compute kernel puts it; `check_fits` names the first rank
that does not fit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from dlrm.config import Config
from dlrm.distributed.capacity import (
    FLOAT_BYTES,
    GB,
    PlanError,
    capacity_key,
    dense_optimizer_factor,
    fix_hint,
    optimizer_state_bytes,
    table_weight_bytes,
)
from dlrm.distributed.plan_records import TablePlan

UVM_KERNELS = ("fused_uvm", "quant_uvm")  # table in host memory (unified virtual memory)
UVM_CACHING_KERNELS = ("fused_uvm_caching", "quant_uvm_caching")  # in host memory, a cache of rows in HBM


@dataclass
class RankMemory:
    """Bytes one rank needs, by part, and where (hbm, ddr); `fits` its capacities."""

    rank: int
    sharded_weights: int = 0
    sharded_optimizer: int = 0
    replicated_weights: int = 0
    replicated_optimizer: int = 0
    uvm_cache: int = 0
    hbm: int = 0
    ddr: int = 0
    uvm_tables: list[str] = field(default_factory=list)
    dense_weights: int = 0
    dense_grads: int = 0
    dense_optimizer: int = 0
    total: int = 0
    fits: bool = True

    def add_shard(self, table: TablePlan, weights: int, optimizer: int, cuda: bool, cache_ratio: float) -> None:
        """Count one shard of `table`: where its compute kernel keeps it (see `memory_summary`)."""
        if table.sharding_type == "data_parallel":
            self.replicated_weights += weights
            self.replicated_optimizer += optimizer
        else:
            self.sharded_weights += weights
            self.sharded_optimizer += optimizer
        kernel = table.compute_kernel
        if not cuda or kernel in UVM_KERNELS or kernel in UVM_CACHING_KERNELS:
            self.ddr += weights + optimizer
        else:
            self.hbm += weights + optimizer
        if cuda and (kernel in UVM_KERNELS or kernel in UVM_CACHING_KERNELS):
            self.uvm_tables.append(table.table)
        if cuda and kernel in UVM_CACHING_KERNELS:
            cache = int((table.cache_load_factor or cache_ratio) * weights)  # fbgemm caches weights, not state
            self.uvm_cache += cache
            self.hbm += cache


def memory_summary(cfg: Config, tables: list[TablePlan], world: int, dense_params: int) -> dict:
    """Bytes per rank in HBM and host DDR, by part, against the capacities.

    On cuda a shard lives where its kernel puts it: fused/dense in HBM; fused_uvm in host DDR;
    fused_uvm_caching in host DDR plus an HBM cache of `load_factor` of its weights (the optimizer state
    stays in host memory). Dense MLPs and data-parallel tables are in HBM. On cpu everything is in DDR.

    Args:
        cfg: the run's config (topology capacities, optimizer, precision).
        tables: the plan's tables.
        world: ranks.
        dense_params: dense parameters per rank.

    Returns:
        The capacities, the optimizers and precision, and "per_rank": each rank's `RankMemory` as a dict.
    """
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

    opt = cfg.optim.embedding.name
    cuda = cfg.topology.device == "cuda"
    ranks = [RankMemory(r) for r in range(world)]
    for t in tables:
        for s in t.shards:
            weights = s.rows * s.cols * table_weight_bytes(cfg)
            ranks[s.rank].add_shard(t, weights, optimizer_state_bytes(opt, s.rows, s.cols), cuda, UVM_CACHING_RATIO)
    dense_w = dense_params * FLOAT_BYTES
    hbm_cap = cfg.topology.hbm_GB * GB if cuda else 0
    ddr_cap = cfg.topology.ddr_GB * GB
    for m in ranks:
        m.dense_weights = m.dense_grads = dense_w
        m.dense_optimizer = dense_w * dense_optimizer_factor(cfg.optim.dense.name)
        dense = m.dense_weights + m.dense_grads + m.dense_optimizer
        if cuda:
            m.hbm += dense
        else:
            m.ddr += dense
        m.total = m.hbm + m.ddr
        m.fits = m.hbm <= hbm_cap and m.ddr <= ddr_cap
    return {
        "hbm_capacity_bytes": hbm_cap,
        "ddr_capacity_bytes": ddr_cap,
        "capacity_key": capacity_key(cfg),
        "embedding_optimizer": opt,
        "embedding_precision": str(cfg.model.embedding_precision),
        "dense_optimizer": cfg.optim.dense.name,
        "per_rank": [asdict(m) for m in ranks],
        "max_rank": max(ranks, key=lambda m: (m.hbm, m.ddr)).rank,
        "sharded_weights_total": sum(m.sharded_weights for m in ranks),
        "uvm_tables": sorted({t for m in ranks for t in m.uvm_tables}),
    }


def check_fits(memory: dict, cfg: Config) -> None:
    """Check every rank's need against its capacity.

    Raises:
        PlanError: naming the first rank whose HBM or DDR need exceeds its capacity.
    """
    for m in memory["per_rank"]:
        for kind, key, cap in (
            ("HBM", "topology.hbm_GB", memory["hbm_capacity_bytes"]),
            ("host DDR", "topology.ddr_GB", memory["ddr_capacity_bytes"]),
        ):
            need = m["hbm" if kind == "HBM" else "ddr"]
            if need > cap:
                raise PlanError(
                    f"rank {m['rank']} needs {need / GB:.2f} GB of {kind} (weights, optimizer state, replicated "
                    f"parts) but has {cap / GB:.2f} GB ({key}); {fix_hint(cfg)}"
                )
