"""Can the model fit: memory per rank (HBM on cuda, DDR on cpu), optimizer state sizes, and lower
bounds checked before TorchRec's planner runs, so a model that cannot fit is refused early, naming
the rank's need, its capacity and the fix (`PlanError`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dlrm.common.errors import UserError
from dlrm.config import Config
from dlrm.config.choices import Precision

if TYPE_CHECKING:  # the model module imports TorchRec (seconds): the memory checks run before it
    from dlrm.models.dlrm import DLRMTrain

GB = 10**9
FLOAT_BYTES = 4  # fp32 dense weights and every optimizer state


def table_weight_bytes(cfg: Config) -> int:
    """Bytes per table weight (model.embedding_precision); optimizer state stays fp32 (fbgemm's)."""
    return Precision(cfg.model.embedding_precision).itemsize


class PlanError(UserError, ValueError):
    """The model cannot be planned on this topology; the message names the rank, the GB and the fix."""

    same_on_all_ranks = True  # every rank checks the same config (the planner runs on rank 0)


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
    """Refuse a model that cannot fit, by cheap lower bounds, before the planner runs.

    Refused when the replicated parts (dense MLPs, data_parallel tables) exceed a rank's HBM (cuda) or DDR
    (cpu); when the sharded tables, spread perfectly, plus the replicated parts exceed a rank's memory
    (host DDR counted on cuda); or when a table pinned to table_wise does not fit one rank.

    Args:
        cfg: the run's config.
        world: ranks.
        dense_params: parameters outside the embedding tables.

    Raises:
        PlanError: naming the rank's need, its capacity and the fix.
    """
    cuda = cfg.topology.device == "cuda"
    cap = capacity_GB(cfg) * GB  # where dense parts and data-parallel tables live
    table_cap = cap + (cfg.topology.ddr_GB * GB if cuda else 0)  # sharded tables may be offloaded (UVM)
    mem_keys = "topology.hbm_GB + topology.ddr_GB" if cuda else "topology.ddr_GB"
    opt = cfg.optim.embedding.name
    pinned = {t.name: cfg.sharding.pinned(t) for t in cfg.model.tables}
    dense = dense_params * FLOAT_BYTES * (2 + dense_optimizer_factor(cfg.optim.dense.name))  # + grads
    table_bytes = {
        t.name: t.rows * t.dim * table_weight_bytes(cfg) + optimizer_state_bytes(opt, t.rows, t.dim)
        for t in cfg.model.tables
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
        at_least = math.ceil(sharded / (table_cap - replicated))  # replicated < cap <= table_cap here
        raise PlanError(
            f"the model needs at least {per_rank / GB:.2f} GB on every rank even if its tables were spread "
            f"perfectly over {world} ranks ({sharded / GB:.1f} GB of sharded tables + optimizer state), "
            f"but a rank has {table_cap / GB:.2f} GB ({mem_keys}), so it needs at least {at_least} such ranks; "
            f"{fix_hint(cfg)}"
        )


def dense_param_count(model) -> int:
    """Parameters of `model` outside its embedding tables (the MLPs, the interaction)."""
    return sum(p.numel() for n, p in model.named_parameters() if "embedding_bags" not in n)


def check_memory(cfg: Config, world: int) -> DLRMTrain:
    """`precheck_memory` on a model built on the meta device (no memory, no process group), so a model
    that cannot fit is refused before anything expensive starts.

    Args:
        cfg: a validated config.
        world: the number of ranks.

    Returns:
        The unsharded model on the meta device, to be sharded (it is built once).

    Raises:
        PlanError: the model cannot fit in `world` ranks' memory.
    """
    from dlrm.models.dlrm import build_model

    model = build_model(cfg.model)
    precheck_memory(cfg, world, dense_param_count(model))
    return model


def planner_refusal(cfg: Config, world: int, error: Exception) -> PlanError:
    """The PlanError for TorchRec's PlannerError: capacity, the largest tables, the fix, TorchRec's reason."""
    opt = cfg.optim.embedding.name
    need = {
        t.name: t.rows * t.dim * table_weight_bytes(cfg) + optimizer_state_bytes(opt, t.rows, t.dim)
        for t in cfg.model.tables
    }
    largest = sorted(need, key=lambda name: need[name], reverse=True)[:3]
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return PlanError(
        f"TorchRec's planner found no plan that fits {world} ranks with {capacity_GB(cfg):.2f} GB each "
        f"({capacity_key(cfg)}) for {len(need)} tables of {sum(need.values()) / GB:.2f} GB "
        f"(weights + {opt} state; largest: {', '.join(f'{n} {need[n] / GB:.2f} GB' for n in largest)}); "
        f"{fix_hint(cfg)}. TorchRec: {reason}"
    )
