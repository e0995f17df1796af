"""Per-rank memory of a sharding plan: HBM and host DDR, by part, against the topology's capacity.

Two stages: `precheck_memory` gives cheap lower bounds before TorchRec's planner runs (a model that
cannot fit fails fast, naming the fix); `memory_summary` counts every shard of the plan where its
compute kernel puts it, and `check_fits` names the first rank that does not fit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from dlrm.config import Config
from dlrm.errors import UserError

if TYPE_CHECKING:  # dlrm.core.sharding imports TorchRec (seconds): not before the config is checked
    from dlrm.core.sharding import TablePlan

GB = 10**9
FLOAT_BYTES = 4  # fp32 weights and optimizer state


class PlanError(UserError, ValueError):
    """The model cannot be planned on this topology; the message names the rank, the GB and the fix."""


def optimizer_state_bytes(name: str, rows: int, cols: int) -> int:
    """Optimizer state of a rows x cols fp32 block: rowwise_adagrad 1 float per row, adagrad 1 per
    element, adam 2 per element, sgd none."""
    if name == "rowwise_adagrad":
        return rows * FLOAT_BYTES
    per_element = {"adagrad": 1, "adam": 2, "sgd": 0}[name]
    return per_element * rows * cols * FLOAT_BYTES


def dense_optimizer_factor(name: str) -> int:
    """Dense optimizer state in units of the parameters' size."""
    return {"sgd": 0, "adagrad": 1, "adam": 2}[name]


def capacity_GB(cfg: Config) -> float:
    """Memory per rank available to the model: HBM on cuda, DDR on cpu."""
    return cfg.topology.hbm_GB if cfg.topology.device == "cuda" else cfg.topology.ddr_GB


def capacity_key(cfg: Config) -> str:
    return "topology.hbm_GB" if cfg.topology.device == "cuda" else "topology.ddr_GB"


def fix_hint(cfg: Config) -> str:
    optimizer = (
        "an embedding optimizer with less state (optim=rowwise_adagrad), "
        if cfg.optim.embedding.name in ("adagrad", "adam")
        else ""
    )
    return (
        f"use more nodes (topology.nodes={cfg.topology.nodes * 2}), a topology with more memory per rank "
        f"(raise {capacity_key(cfg)}), {optimizer}or smaller tables (model.tables[*].rows)"
    )


def precheck_memory(cfg: Config, world: int, dense_params: int) -> None:
    """Cheap lower bounds, before the planner runs: the model cannot fit if

    - the replicated parts (dense MLPs, tables pinned to data_parallel) exceed a rank's HBM (cuda)
      or DDR (cpu);
    - its sharded tables, spread perfectly over all ranks, plus the replicated parts exceed a rank's
      memory, counting host DDR on cuda (TorchRec may keep tables there by UVM);
    - a table pinned to table_wise does not fit one rank likewise.
    """
    from dlrm.core.sharding import table_sharding  # noqa: PLC0415  (imports TorchRec)

    cuda = cfg.topology.device == "cuda"
    cap = capacity_GB(cfg) * GB  # where dense parts and data-parallel tables live
    table_cap = cap + (cfg.topology.ddr_GB * GB if cuda else 0)  # sharded tables may be offloaded (UVM)
    mem_keys = "topology.hbm_GB + topology.ddr_GB" if cuda else "topology.ddr_GB"
    opt = cfg.optim.embedding.name
    pinned = table_sharding(cfg.sharding, cfg.model)
    dense = dense_params * FLOAT_BYTES * (2 + dense_optimizer_factor(cfg.optim.dense.name))  # + grads
    table_bytes = {
        t.name: t.rows * t.dim * FLOAT_BYTES + optimizer_state_bytes(opt, t.rows, t.dim) for t in cfg.model.tables
    }
    replicated = dense + sum(b for name, b in table_bytes.items() if pinned[name] == "data_parallel")
    if replicated > cap:
        dp = [n for n in table_bytes if pinned[n] == "data_parallel"]
        raise PlanError(
            f"every rank needs {replicated / GB:.2f} GB for replicated parts (dense MLPs"
            + (f" and data_parallel tables {', '.join(dp)}" if dp else "")
            + f") but has {cap / GB:.2f} GB ({capacity_key(cfg)}); "
            + ("pin those tables to a sharded type (sharding.per_table.NAME=row_wise) or " if dp else "")
            + "use a topology with more memory per rank"
        )
    for t in cfg.model.tables:
        if pinned[t.name] == "table_wise" and table_bytes[t.name] + replicated > table_cap:
            raise PlanError(
                f"table {t.name} is pinned to table_wise but needs {(table_bytes[t.name] + replicated) / GB:.2f} GB "
                f"on one rank (weights + {opt} state + replicated parts), which has {table_cap / GB:.2f} GB "
                f"({mem_keys}); pin it to row_wise, table_row_wise or column_wise "
                f"(sharding.per_table.{t.name}=row_wise)"
            )
    sharded = sum(b for name, b in table_bytes.items() if pinned[name] != "data_parallel")
    per_rank = sharded / world + replicated
    if per_rank > table_cap:
        raise PlanError(
            f"the model needs at least {per_rank / GB:.2f} GB on every rank even if its tables were spread "
            f"perfectly over {world} ranks ({sharded / GB:.1f} GB of sharded tables + optimizer state), "
            f"but a rank has {table_cap / GB:.2f} GB ({mem_keys}); {fix_hint(cfg)}"
        )


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
            cache = int((table.cache_load_factor or cache_ratio) * (weights + optimizer))
            self.uvm_cache += cache
            self.hbm += cache


def memory_summary(cfg: Config, tables: list[TablePlan], world: int, dense_params: int) -> dict:
    """Bytes per rank in HBM and in host DDR, by part, against the capacities; `fits` per rank.

    On cuda a shard lives where its kernel puts it: fused/dense in HBM; fused_uvm in host DDR;
    fused_uvm_caching in host DDR plus a cache of `load_factor` (TorchRec's default 0.2) of it in HBM.
    Dense MLPs (weights, gradients, optimizer state) and data-parallel tables are in HBM. On cpu
    everything is in DDR (and hbm is 0).
    """
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

    opt = cfg.optim.embedding.name
    cuda = cfg.topology.device == "cuda"
    ranks = [RankMemory(r) for r in range(world)]
    for t in tables:
        for s in t.shards:
            weights = s.rows * s.cols * FLOAT_BYTES
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
        "dense_optimizer": cfg.optim.dense.name,
        "per_rank": [asdict(m) for m in ranks],
        "max_rank": max(ranks, key=lambda m: (m.hbm, m.ddr)).rank,
        "sharded_weights_total": sum(m.sharded_weights for m in ranks),
        "uvm_tables": sorted({t for m in ranks for t in m.uvm_tables}),
    }


def check_fits(memory: dict, cfg: Config) -> None:
    """Raise PlanError naming the first rank whose HBM or DDR need exceeds its capacity."""
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
