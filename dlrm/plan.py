"""Dry-run planner: `python -m dlrm.plan [--json] [--ranks-per-node N] [--proposer P] [hydra overrides]`.

For any model and topology config, on any machine and without the hardware (the model is built on
the meta device, no process group is created), prints:

- the sharding plan TorchRec's planner makes for the trainer (same planner, constraints and
  optimizer as `dlrm.train`): table, sharding type, compute kernel, ranks;
- per-rank memory: sharded table weights and their optimizer state, replicated parts (dense MLPs,
  data-parallel tables, their optimizer state, dense gradients), against the capacity per rank
  (`topology.hbm_GB` on cuda, `topology.ddr_GB` on cpu);
- per-iteration communication per rank (forward + backward) for `data.global_batch_size`: the
  embedding exchange (input ids, pooled embeddings, their gradients) split into intra-node and
  inter-node bytes, and the allreduce bytes (dense gradients and data-parallel tables), with times
  from `dlrm.comms.model.step_comm_time`.

Exit status: 0 with a plan; 2 when the config is invalid or the model does not fit (the message
names the key or the rank, the needed and available GB and the fix).

Example::

    python -m dlrm.plan model=mlperf_dcnv2 topology=dgx_h100 topology.nodes=16 \\
        data.global_batch_size=65536 --json
"""

from __future__ import annotations

from dlrm.errors import UserError
import argparse
import json
import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from dlrm.config import Config, ConfigError, compose, validate, validate_world

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
GB = 10**9
FLOAT_BYTES = 4  # fp32 weights, optimizer state, pooled embeddings and their gradients
ID_BYTES = 8  # int64 ids in the input KeyedJaggedTensor
PROPOSERS = ("default", "greedy", "uniform")


class PlanError(UserError, ValueError):
    """The model cannot be planned on this topology; the message names the rank, the GB and the fix."""

    same_on_all_ranks = True  # every rank checks the same config (the planner runs on rank 0)


# ----------------------------------------------------------------------------------------------
# Config


def world_of(cfg: Config, ranks_per_node: Optional[int]) -> tuple[int, int]:
    """(world size, ranks per node) for planning; checks them like the launcher's world is checked."""
    tp = cfg.topology
    if ranks_per_node is not None and ranks_per_node <= 0:
        raise ConfigError(f"--ranks-per-node {ranks_per_node} is invalid: it must be a positive number")
    if tp.ranks_per_node is None and ranks_per_node is None:
        raise ConfigError(
            f"config key 'topology.ranks_per_node' = None: topology '{tp.name}' takes it from the launcher, "
            "but planning has no launcher; set topology.ranks_per_node=N or pass --ranks-per-node N"
        )
    if tp.ranks_per_node is not None and ranks_per_node is not None and tp.ranks_per_node != ranks_per_node:
        raise ConfigError(
            f"config key 'topology.ranks_per_node' = {tp.ranks_per_node} does not match --ranks-per-node "
            f"{ranks_per_node}: drop one of them or make them equal"
        )
    g = ranks_per_node or tp.ranks_per_node
    world = tp.nodes * g
    validate_world(cfg, world, g)  # global batch divisible by the world size, etc.
    return world, g


# ----------------------------------------------------------------------------------------------
# Memory


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


def _capacity_key(cfg: Config) -> str:
    return "topology.hbm_GB" if cfg.topology.device == "cuda" else "topology.ddr_GB"


def _fix_hint(cfg: Config) -> str:
    optimizer = (
        "an embedding optimizer with less state (optim=rowwise_adagrad), "
        if cfg.optim.embedding.name in ("adagrad", "adam")
        else ""
    )
    return (
        f"use more nodes (topology.nodes={cfg.topology.nodes * 2}), a topology with more memory per rank "
        f"(raise {_capacity_key(cfg)}), {optimizer}or smaller tables (model.tables[*].rows)"
    )


def precheck_memory(cfg: Config, world: int, dense_params: int) -> None:
    """Cheap lower bounds, before the planner runs: the model cannot fit if

    - the replicated parts (dense MLPs, tables pinned to data_parallel) exceed a rank's HBM (cuda)
      or DDR (cpu);
    - its sharded tables, spread perfectly over all ranks, plus the replicated parts exceed a rank's
      memory, counting host DDR on cuda (TorchRec may keep tables there by UVM);
    - a table pinned to table_wise does not fit one rank likewise.
    """
    from dlrm.sharding import table_sharding  # noqa: PLC0415  (imports TorchRec)

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
            + f") but has {cap / GB:.2f} GB ({_capacity_key(cfg)}); "
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
            f"{_fix_hint(cfg)}"
        )


def dense_param_count(model) -> int:
    """Parameters of `model` outside its embedding tables (the MLPs, the interaction)."""
    return sum(p.numel() for n, p in model.named_parameters() if "embedding_bags" not in n)


def check_memory(cfg: Config, world: int) -> None:
    """`precheck_memory` for the trainer: builds the model on the meta device (no memory, no process
    group), so a model that cannot fit is refused before anything expensive starts."""
    from dlrm.model import build_model

    precheck_memory(cfg, world, dense_param_count(build_model(cfg.model)))


def planner_refusal(cfg: Config, world: int, error: Exception) -> PlanError:
    """The PlanError for TorchRec's PlannerError: capacity, the largest tables, the fix, TorchRec's reason."""
    opt = cfg.optim.embedding.name
    need = {t.name: t.rows * t.dim * FLOAT_BYTES + optimizer_state_bytes(opt, t.rows, t.dim) for t in cfg.model.tables}
    largest = sorted(need, key=need.get, reverse=True)[:3]
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return PlanError(
        f"TorchRec's planner found no plan that fits {world} ranks with {capacity_GB(cfg):.2f} GB each "
        f"({_capacity_key(cfg)}) for {len(need)} tables of {sum(need.values()) / GB:.2f} GB "
        f"(weights + {opt} state; largest: {', '.join(f'{n} {need[n] / GB:.2f} GB' for n in largest)}); "
        f"{_fix_hint(cfg)}. TorchRec: {reason}"
    )


# ----------------------------------------------------------------------------------------------
# Planning


def _quiet_torchrec() -> None:
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger("root").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")


def run_planner(cfg: Config, model, world: int, ranks_per_node: int, proposer: str = "default"):
    """TorchRec's ShardingPlan for `model` (on meta) on `world` ranks, no process group.

    proposer 'default' is exactly the trainer's planner (`dlrm.sharding.plan_sharding`); 'greedy' and
    'uniform' replace TorchRec's proposers by one cheaper one (faster on many ranks; the plan may differ).
    """
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.proposers import GreedyProposer, UniformProposer
    from torchrec.distributed.planner.types import PlannerError

    from dlrm.sharding import AnyDeviceEmbeddingBagCollectionSharder, constraints, plan_sharding
    from dlrm.topology import planner_topology

    topology = planner_topology(cfg.topology, world, ranks_per_node)
    try:
        if proposer == "default":
            return plan_sharding(cfg, model, topology, pg=None)
        planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=cfg.data.global_batch_size // world,
            constraints=constraints(cfg),
            proposer=GreedyProposer() if proposer == "greedy" else UniformProposer(),
        )
        return planner.plan(model, [AnyDeviceEmbeddingBagCollectionSharder()])
    except PlannerError as e:
        raise planner_refusal(cfg, world, e) from e


@dataclass
class Shard:
    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int


def plan_tables(plan, cfg: Config, world: int) -> List[dict]:
    """One dict per table, in config order: name, rows, dim, features, pooling, sharding type,
    kernel, ranks, and its shards (rank, row/col offset, rows, cols); data_parallel has one full
    shard per rank."""
    by_name = {}
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            by_name[name] = ps
    out = []
    for t in cfg.model.tables:
        ps = by_name[t.name]
        if ps.sharding_spec is None:  # data_parallel: a full replica on every rank
            shards = [Shard(r, 0, 0, t.rows, t.dim) for r in (ps.ranks or range(world))]
        else:
            shards = [
                Shard(md.placement.rank(), *md.shard_offsets, *md.shard_sizes) for md in ps.sharding_spec.shards
            ]
        out.append(
            {
                "table": t.name,
                "rows": t.rows,
                "dim": t.dim,
                "features": len(t.features),
                "pooling": t.pooling,
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "cache_load_factor": getattr(ps.cache_params, "load_factor", None),
                "ranks": sorted({s.rank for s in shards}),
                "shards": shards,
            }
        )
    return out


# ----------------------------------------------------------------------------------------------
# Communication


def traffic(tables: List[dict], world: int, ranks_per_node: int, global_batch: int):
    """Bytes per iteration (forward + backward) rank i sends to rank j: T[i, j], split by kind.

    B_l = global_batch / world samples per rank; per table: F features, L ids per sample per feature,
    dim D. Ids are 8 bytes, pooled embeddings and their gradients 4 bytes per element. Ids are
    assumed spread uniformly over the rows, so a row-sharded table gets a share of the ids equal to
    its share of the rows. Per sharding type:

    - table_wise / column_wise / table_column_wise: each shard's rank gets every rank's ids of the
      table (B_l F L ids), and sends every other rank its B_l x F x cols pooled slice; the backward
      sends the gradients of those slices back (same bytes, reversed).
    - row_wise (across all ranks): ids are bucketised by row range to the shards; each shard computes
      partial sums for the global batch and reduce-scatters them (sends B_l F D to each other shard
      rank); the backward allgathers the gradients (same bytes, reversed).
    - table_row_wise / grid_shard (row shards within one node): ids bucketised as for row_wise;
      intra-node reduce-scatter (each shard sends (B / g) F D to each other shard of its node), then
      cross-node alltoall among ranks of the same local index (B_l F D to each); backward reversed.
    - data_parallel: no alltoall (its gradients are allreduced, see `allreduce_bytes`).
    Returns {"ids": T, "pooled_fwd": T, "pooled_bwd": T} (numpy arrays [world, world], diagonal 0).
    """
    import numpy as np

    p, g = world, ranks_per_node
    b_local = global_batch / p
    ids = np.zeros((p, p))
    fwd = np.zeros((p, p))
    node = np.arange(p) // g
    others = ~np.eye(p, dtype=bool)
    for t in tables:
        kind = t["sharding_type"]
        if kind == "data_parallel":
            continue
        F, L, rows = t["features"], t["pooling"], t["rows"]
        id_bytes = b_local * F * L * ID_BYTES  # one rank's ids of this table
        if kind in ("table_wise", "column_wise", "table_column_wise"):
            for s in t["shards"]:
                ids[:, s.rank] += id_bytes
                fwd[s.rank, :] += b_local * F * s.cols * FLOAT_BYTES
            continue
        # row-sharded: group shards by column block (grid_shard has several), each group row-sharded
        groups: Dict[int, List[Shard]] = {}
        for s in t["shards"]:
            groups.setdefault(s.col_offset, []).append(s)
        for group in groups.values():
            cols = group[0].cols
            for s in group:
                ids[:, s.rank] += id_bytes * s.rows / rows
            ranks = [s.rank for s in group]
            nodes_of_group = {int(node[r]) for r in ranks}
            if kind in ("table_row_wise", "grid_shard") and len(nodes_of_group) == 1:
                n_ranks = len(ranks)
                for r in ranks:
                    for r2 in ranks:  # intra-node reduce-scatter of the global batch's partial sums
                        if r2 != r:
                            fwd[r, r2] += global_batch / n_ranks * F * cols * FLOAT_BYTES
                    same_local = [d for d in range(p) if d % g == r % g and node[d] != node[r]]
                    fwd[r, same_local] += b_local * F * cols * FLOAT_BYTES  # cross-node alltoall
            else:  # row_wise: reduce-scatter over the shard ranks of every rank's B_l slice
                for r in ranks:
                    fwd[r, :] += b_local * F * cols * FLOAT_BYTES
    ids *= others
    fwd *= others
    return {"ids": ids, "pooled_fwd": fwd, "pooled_bwd": fwd.T.copy()}


def comm_summary(cfg: Config, tables: List[dict], world: int, ranks_per_node: int, dense_params: int) -> dict:
    """Per-rank, per-iteration bytes (sent and received, intra- and inter-node) and modelled seconds.

    The estimate uses the busiest rank (max over ranks of bytes sent or received at each level),
    since every rank waits for the slowest in a collective.
    """
    import numpy as np

    from dlrm.comms.model import step_comm_time

    p, g = world, ranks_per_node
    mats = traffic(tables, p, g, cfg.data.global_batch_size)
    total = sum(mats.values())
    node = np.arange(p) // g
    same = node[:, None] == node[None, :]
    sent_intra = (total * same).sum(axis=1)
    sent_inter = (total * ~same).sum(axis=1)
    recv_intra = (total * same).sum(axis=0)
    recv_inter = (total * ~same).sum(axis=0)
    dp_params = sum(t["rows"] * t["dim"] for t in tables if t["sharding_type"] == "data_parallel")
    allreduce = FLOAT_BYTES * (dense_params + dp_params)
    busiest_intra = float(max(sent_intra.max(), recv_intra.max()))
    busiest_inter = float(max(sent_inter.max(), recv_inter.max()))
    times = step_comm_time(
        cfg.topology,
        alltoall_bytes_intra=busiest_intra if g > 1 else 0.0,
        alltoall_bytes_inter=busiest_inter if cfg.topology.nodes > 1 else 0.0,
        allreduce_bytes=allreduce,
        ranks_per_node=g,
        alltoall_count=3,  # ids, pooled embeddings forward, their gradients backward
    )
    by_kind = {
        k: {"intra": float((m * same).sum() / p), "inter": float((m * ~same).sum() / p)} for k, m in mats.items()
    }
    return {
        "global_batch_size": cfg.data.global_batch_size,
        "local_batch_size": cfg.data.global_batch_size // p,
        "alltoall_bytes_intra_mean": float(sent_intra.mean()),
        "alltoall_bytes_inter_mean": float(sent_inter.mean()),
        "alltoall_bytes_intra_max": busiest_intra,
        "alltoall_bytes_inter_max": busiest_inter,
        "alltoall_bytes_by_kind_mean": by_kind,
        "allreduce_bytes": allreduce,
        "allreduce_dense_params": dense_params,
        "allreduce_data_parallel_table_params": dp_params,
        "per_rank": [
            {
                "rank": r,
                "sent_intra": float(sent_intra[r]),
                "sent_inter": float(sent_inter[r]),
                "recv_intra": float(recv_intra[r]),
                "recv_inter": float(recv_inter[r]),
            }
            for r in range(p)
        ],
        "time_s": times,
    }


# ----------------------------------------------------------------------------------------------
# Memory per rank


UVM_KERNELS = ("fused_uvm", "quant_uvm")  # table in host memory (unified virtual memory)
UVM_CACHING_KERNELS = ("fused_uvm_caching", "quant_uvm_caching")  # in host memory, a cache of rows in HBM


def memory_summary(cfg: Config, tables: List[dict], world: int, dense_params: int) -> dict:
    """Bytes per rank in HBM and in host DDR, by part, against the capacities; `fits` per rank.

    On cuda a shard lives where its kernel puts it: fused/dense in HBM; fused_uvm in host DDR;
    fused_uvm_caching in host DDR plus a cache of `load_factor` (TorchRec's default 0.2) of it in HBM.
    Dense MLPs (weights, gradients, optimizer state) and data-parallel tables are in HBM. On cpu
    everything is in DDR (and hbm is 0).
    """
    from torchrec.distributed.planner.constants import UVM_CACHING_RATIO

    opt = cfg.optim.embedding.name
    cuda = cfg.topology.device == "cuda"
    keys = ("sharded_weights", "sharded_optimizer", "replicated_weights", "replicated_optimizer", "uvm_cache")
    ranks = [dict({"rank": r}, **{k: 0 for k in keys}, hbm=0, ddr=0, uvm_tables=[]) for r in range(world)]
    for t in tables:
        dp = t["sharding_type"] == "data_parallel"
        kernel = t["compute_kernel"]
        for s in t["shards"]:
            w = s.rows * s.cols * FLOAT_BYTES
            o = optimizer_state_bytes(opt, s.rows, s.cols)
            m = ranks[s.rank]
            m["replicated_weights" if dp else "sharded_weights"] += w
            m["replicated_optimizer" if dp else "sharded_optimizer"] += o
            if not cuda:
                m["ddr"] += w + o
            elif kernel in UVM_KERNELS or kernel in UVM_CACHING_KERNELS:
                m["ddr"] += w + o
                m["uvm_tables"].append(t["table"])
                if kernel in UVM_CACHING_KERNELS:
                    ratio = t.get("cache_load_factor") or UVM_CACHING_RATIO
                    cache = int(ratio * (w + o))
                    m["uvm_cache"] += cache
                    m["hbm"] += cache
            else:
                m["hbm"] += w + o
    dense_w = dense_params * FLOAT_BYTES
    hbm_cap = cfg.topology.hbm_GB * GB if cuda else 0
    ddr_cap = cfg.topology.ddr_GB * GB
    for m in ranks:
        m["dense_weights"] = dense_w
        m["dense_grads"] = dense_w
        m["dense_optimizer"] = dense_w * dense_optimizer_factor(cfg.optim.dense.name)
        dense = m["dense_weights"] + m["dense_grads"] + m["dense_optimizer"]
        m["hbm" if cuda else "ddr"] += dense
        m["total"] = m["hbm"] + m["ddr"]
        m["fits"] = m["hbm"] <= hbm_cap and m["ddr"] <= ddr_cap
    return {
        "hbm_capacity_bytes": hbm_cap,
        "ddr_capacity_bytes": ddr_cap,
        "capacity_key": _capacity_key(cfg),
        "embedding_optimizer": opt,
        "dense_optimizer": cfg.optim.dense.name,
        "per_rank": ranks,
        "max_rank": max(ranks, key=lambda m: (m["hbm"], m["ddr"]))["rank"],
        "sharded_weights_total": sum(m["sharded_weights"] for m in ranks),
        "uvm_tables": sorted({t for m in ranks for t in m["uvm_tables"]}),
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
                    f"parts) but has {cap / GB:.2f} GB ({key}); {_fix_hint(cfg)}"
                )


# ----------------------------------------------------------------------------------------------
# Whole report


def make_plan(cfg: Config, ranks_per_node: Optional[int] = None, proposer: str = "default") -> dict:
    """The report dict (`--json` prints it). Raises ConfigError or PlanError (nothing fits)."""
    validate(cfg)
    world, g = world_of(cfg, ranks_per_node)
    if proposer not in PROPOSERS:
        raise ConfigError(f"--proposer {proposer!r} is invalid: choose one of {', '.join(PROPOSERS)}")
    timings = {}
    t0 = time.perf_counter()
    from dlrm.model import build_model
    from dlrm.optim import fuse_embedding_optimizer

    model = build_model(cfg.model)  # meta device: no table memory
    fuse_embedding_optimizer(model, cfg.optim.embedding)  # as the trainer: the planner sees its state size
    dense_params = dense_param_count(model)
    timings["build_s"] = time.perf_counter() - t0
    precheck_memory(cfg, world, dense_params)
    t0 = time.perf_counter()
    plan = run_planner(cfg, model, world, g, proposer)
    timings["planner_s"] = time.perf_counter() - t0
    tables = plan_tables(plan, cfg, world)
    memory = memory_summary(cfg, tables, world, dense_params)
    check_fits(memory, cfg)
    comms = comm_summary(cfg, tables, world, g, dense_params)
    return {
        "model": {
            "tables": len(cfg.model.tables),
            "embedding_params": sum(t["rows"] * t["dim"] for t in tables),
            "dense_params": dense_params,
        },
        "topology": {
            "name": cfg.topology.name,
            "nodes": cfg.topology.nodes,
            "ranks_per_node": g,
            "world_size": world,
            "device": cfg.topology.device,
            "capacity_GB": capacity_GB(cfg),
        },
        "proposer": proposer,
        "plan": [
            {k: v for k, v in t.items() if k != "shards"}
            | {"shards": [s.__dict__ for s in t["shards"]] if t["sharding_type"] != "data_parallel" else []}
            for t in tables
        ],
        "memory": memory,
        "comms": comms,
        "timings": timings,
    }


def _gb(n: float) -> str:
    return f"{n / GB:.2f}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _ranks(ranks: List[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def format_report(report: dict) -> str:
    """Human-readable plan, per-rank memory and communication summary."""
    tp, mem, cm = report["topology"], report["memory"], report["comms"]
    lines = [
        f"topology {tp['name']}: {tp['nodes']} node(s) x {tp['ranks_per_node']} ranks = {tp['world_size']} ranks "
        f"({tp['device']}, {tp['capacity_GB']:.1f} GB per rank); model: {report['model']['tables']} tables, "
        f"{report['model']['embedding_params'] / 1e9:.2f} G embedding params, "
        f"{report['model']['dense_params'] / 1e6:.2f} M dense params",
        "",
        "sharding plan",
        f"  {'table':<16} {'rows':>12} {'sharding type':<18} {'kernel':<8} ranks",
    ]
    for t in report["plan"]:
        lines.append(
            f"  {t['table']:<16} {t['rows']:>12} {t['sharding_type']:<18} {t['compute_kernel']:<8} {_ranks(t['ranks'])}"
        )
    lines += [
        "",
        f"memory per rank, GB (embedding optimizer {mem['embedding_optimizer']}, dense {mem['dense_optimizer']}; "
        f"capacity: HBM {_gb(mem['hbm_capacity_bytes'])} (topology.hbm_GB), "
        f"host DDR {_gb(mem['ddr_capacity_bytes'])} (topology.ddr_GB))",
        f"  {'rank':>5} {'shard w':>9} {'shard opt':>9} {'repl w':>9} {'repl opt':>9} {'dense':>9} "
        f"{'uvm cache':>9} {'HBM':>9} {'DDR':>9}  fits",
    ]
    for m in mem["per_rank"]:
        dense = m["dense_weights"] + m["dense_grads"] + m["dense_optimizer"]
        lines.append(
            f"  {m['rank']:>5} {_gb(m['sharded_weights']):>9} {_gb(m['sharded_optimizer']):>9} "
            f"{_gb(m['replicated_weights']):>9} {_gb(m['replicated_optimizer']):>9} {_gb(dense):>9} "
            f"{_gb(m['uvm_cache']):>9} {_gb(m['hbm']):>9} {_gb(m['ddr']):>9}  {'yes' if m['fits'] else 'NO'}"
        )
    if mem["uvm_tables"]:
        lines.append(
            "  note: tables kept in host memory by UVM (kernel fused_uvm*, slower lookups): "
            + ", ".join(mem["uvm_tables"])
        )
    ts = cm["time_s"]
    kinds = cm["alltoall_bytes_by_kind_mean"]
    lines += [
        "",
        f"communication per iteration (global batch {cm['global_batch_size']}, {cm['local_batch_size']} per rank; "
        "MB per rank, forward + backward)",
        f"  embedding alltoall sent, mean over ranks: intra-node {_mb(cm['alltoall_bytes_intra_mean'])}, "
        f"inter-node {_mb(cm['alltoall_bytes_inter_mean'])}",
        f"    of which ids {_mb(kinds['ids']['intra'] + kinds['ids']['inter'])}, pooled forward "
        f"{_mb(kinds['pooled_fwd']['intra'] + kinds['pooled_fwd']['inter'])}, gradients backward "
        f"{_mb(kinds['pooled_bwd']['intra'] + kinds['pooled_bwd']['inter'])}",
        f"  busiest rank (sent or received): intra-node {_mb(cm['alltoall_bytes_intra_max'])}, "
        f"inter-node {_mb(cm['alltoall_bytes_inter_max'])}",
        f"  allreduce: {_mb(cm['allreduce_bytes'])} ({cm['allreduce_dense_params']} dense params + "
        f"{cm['allreduce_data_parallel_table_params']} data-parallel table params, fp32)",
        f"  modelled time (dlrm.comms.model): alltoall intra {ts['alltoall_intra_s'] * 1e3:.3f} ms, "
        f"inter {ts['alltoall_inter_s'] * 1e3:.3f} ms, allreduce {ts['allreduce_s'] * 1e3:.3f} ms, "
        f"total {ts['total_s'] * 1e3:.3f} ms",
        f"planner: {report['proposer']} proposer, {report['timings']['planner_s']:.1f} s",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, List[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m dlrm.plan",
        description="Sharding plan, per-rank memory and per-iteration communication, without the hardware. "
        "Other arguments are Hydra overrides, as for dlrm.train (e.g. model=mlperf_dcnv2 topology=dgx_h100).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--ranks-per-node", type=int, default=None, help="for topologies with ranks_per_node=null")
    parser.add_argument(
        "--proposer",
        choices=PROPOSERS,
        default="default",
        help="default: the trainer's planner; greedy/uniform: one cheaper TorchRec proposer (the plan may differ)",
    )
    args, overrides = parser.parse_known_args(list(argv))
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        parser.error(f"unknown option(s) {' '.join(bad)}; Hydra overrides look like key=value")
    return args, overrides


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the planner for these arguments; print the report; return the exit status (0, or 2)."""
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    if argv is None:  # as a command: TorchRec's warnings and INFO logs would drown the report
        _quiet_torchrec()
    try:
        cfg = compose(overrides)
        report = make_plan(cfg, args.ranks_per_node, args.proposer)
    except (ConfigError, PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
