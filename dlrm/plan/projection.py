"""Step time projected over node counts (weak scaling): compute, alltoall and allreduce per step.

The per-rank batch stays fixed; N nodes train a global batch of b * N * g. Per N and dense sync mode
(allreduce, hierarchical, local_sgd) a row splits the step into phases that sum to it:

    step_s = dense_compute + embedding_compute + alltoall + allreduce_exposed + other

Compute comes from the topology's peak figures or a measured one-node run; communication from the
traffic and cost models on the plan re-placed for N nodes; the allreduce overlaps the backward and only
its excess is exposed.
"""

# The model and its calibration: docs/design/planning.md.
from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import numpy as np

from dlrm.common.io import JSON_LIMIT, UnreadableFileError, parse_json, read_bounded
from dlrm.comms.costmodel import Link, backend_of, ring_time, two_level_time
from dlrm.comms.traffic import FLOAT_BYTES, comm_summary
from dlrm.config import Config, ConfigError
from dlrm.distributed.plan_records import Shard, TablePlan

SYNC_MODES = ("allreduce", "hierarchical", "local_sgd")
PHASES = ("dense_compute", "embedding_compute", "alltoall", "allreduce_exposed", "other")
OVERLAP_RULE = (
    "allreduce overlaps the backward compute (dense + embedding backward) and only its excess is exposed; "
    "alltoalls are exposed; step = dense + embedding compute + alltoall + exposed allreduce + other"
)
PLANNING = (
    "TorchRec's planner runs twice, for one node and for the largest node count (narrowed search above 256 ranks); "
    "each node count is projected with both plans' sharding types and column blocks, re-placed on its world "
    "(dlrm.plan.projection.replace_shards), and the faster is kept (row key plan_nodes)"
)
CALIBRATION = (
    "with --measured, the one-node run's communication phases less the model's one-node figures are added to "
    "every node count's alltoall (input_dist + emb_a2a_fwd + grad_a2a) and exposed allreduce (dense_allreduce; "
    "divided by H for local SGD)"
)
EMB_BACKWARD_PASSES = 3  # read the row gradient, read and write the row (fused optimizer update)
A2A_PHASES = ("input_dist", "emb_a2a_fwd", "grad_a2a")  # the measured embedding exchange


MAX_NODES = 65536  # --scale's largest node count (dlrm.plan.planner.MAX_RANKS ranks of one each)


def parse_scale(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; ConfigError unless every entry is a positive integer."""
    out = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            n = 0
        if not 0 < n <= MAX_NODES:
            raise ConfigError(
                f"--scale {text!r}: {item.strip()!r} is not a positive node count (at most {MAX_NODES:,}); "
                "pass node counts like --scale 1,2,4,8"
            )
        out.append(n)
    return sorted(set(out))


def check_sync_period(sync_period: int) -> None:
    if sync_period < 1:
        raise ConfigError(f"--sync-period {sync_period} is invalid: local SGD syncs every H >= 1 steps; pass e.g. 4")


def load_measured(path: str) -> dict[str, float]:
    """Per-phase seconds of a trainer run: `step_breakdown.phase_s` of its summary.json; ConfigError otherwise."""
    fix = "pass the summary.json of a run trained with trainer.breakdown=true (RUN_DIR/summary.json)"
    try:
        data = parse_json(read_bounded(path, JSON_LIMIT))
    except FileNotFoundError:
        raise ConfigError(f"--measured {path!r} does not exist; {fix}") from None
    except (OSError, ValueError, UnreadableFileError) as e:
        raise ConfigError(f"--measured {path!r} is not readable JSON ({e}); {fix}") from None
    phases = data.get("step_breakdown", {}).get("phase_s") if isinstance(data, dict) else None
    if not isinstance(phases, dict) or not phases:
        raise ConfigError(f"--measured {path!r} has no step_breakdown.phase_s; {fix}")
    for k, v in phases.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"--measured {path!r}: step_breakdown.phase_s.{k} = {v!r} is not seconds >= 0; {fix}")
    return {k: float(v) for k, v in phases.items()}


def check_peak_figures(cfg: Config) -> None:
    """ConfigError naming the missing topology key when the projection cannot model compute."""
    for key in ("dense_tflops", "mem_bw_GBps"):
        if getattr(cfg.topology, key) is None:
            raise ConfigError(
                f"config key 'topology.{key}' = None: topology '{cfg.topology.name}' has no peak figure to model "
                f"compute; set topology.{key}=X or pass --measured RUN_DIR/summary.json"
            )


def compute_times(cfg: Config, tables, dense_params: int, b_local: float, measured: dict | None) -> dict[str, float]:
    """Seconds per step on one rank: dense, embedding, backward (their backward part), other.

    Args:
        cfg: the run's config (its topology's peak figures).
        tables: the plan's tables.
        dense_params: dense parameters.
        b_local: samples per rank and step.
        measured: a one-node run's per-phase seconds, used instead of the peak figures; or None.
    """
    if measured is not None:
        m = measured.get
        dense = m("dense_fwd", 0.0) + m("backward", 0.0) + m("optimizer", 0.0)
        return {
            "dense": dense,
            "embedding": m("emb_lookup", 0.0),
            "backward": m("backward", 0.0),
            "other": m("data", 0.0) + m("other", 0.0),
        }
    check_peak_figures(cfg)
    tflops, mem_bw = cast(float, cfg.topology.dense_tflops), cast(float, cfg.topology.mem_bw_GBps)
    flops = 2 * dense_params * b_local  # forward multiply-adds of the MLPs and cross layers
    dense_fwd = flops / (tflops * 1e12)
    row_bytes = b_local * sum(t.features * t.pooling * t.dim * FLOAT_BYTES for t in tables)
    emb_fwd = row_bytes / (mem_bw * 1e9)
    emb_bwd = EMB_BACKWARD_PASSES * emb_fwd
    return {"dense": 3 * dense_fwd, "embedding": emb_fwd + emb_bwd, "backward": 2 * dense_fwd + emb_bwd, "other": 0.0}


def replace_shards(tables, world: int, ranks_per_node: int):
    """The tables with their shards placed on `world` ranks, keeping sharding type and column blocks.

    table/column-wise shards go to the least loaded rank (load: pooled columns x features), largest
    first; row_wise is cut into `world` equal row ranges, one per rank; table_row_wise / grid_shard
    column blocks are row-sharded over the g ranks of the least loaded node; data_parallel is on every rank.
    """
    g, nodes = ranks_per_node, world // ranks_per_node
    load = np.zeros(world)
    node_load = np.zeros(nodes)
    out = {}
    order = sorted(tables, key=lambda t: -t.features * t.dim)
    for t in order:
        kind = t.sharding_type
        blocks = sorted({(s.col_offset, s.cols) for s in t.shards}) or [(0, t.dim)]
        shards = []
        if kind == "data_parallel":
            shards = [Shard(r, 0, 0, t.rows, t.dim) for r in range(world)]
        elif kind == "row_wise":
            bounds = np.linspace(0, t.rows, world + 1).astype(int)
            shards = [Shard(r, int(bounds[r]), 0, int(bounds[r + 1] - bounds[r]), t.dim) for r in range(world)]
        elif kind in ("table_row_wise", "grid_shard"):
            for col, cols in blocks:
                n = int(np.argmin(node_load))
                node_load[n] += t.features * cols
                bounds = np.linspace(0, t.rows, g + 1).astype(int)
                shards += [
                    Shard(n * g + i, int(bounds[i]), col, int(bounds[i + 1] - bounds[i]), cols) for i in range(g)
                ]
        else:  # table_wise, column_wise, table_column_wise
            for col, cols in blocks:
                r = int(np.argmin(load))
                load[r] += t.features * cols
                shards.append(Shard(r, 0, col, t.rows, cols))
        out[t.table] = replace(t, shards=shards, ranks=sorted({s.rank for s in shards}))
    return [out[t.table] for t in tables]


def flat_allreduce_time(topology, nodes: int, g: int, nbytes: float) -> float:
    """One ring over all N g ranks (`costmodel.ring_time`): at the intra-node rate, or once N > 1 at
    min(intra-node rate, g x the inter-node rate per rank), each node's uplink carrying one ring edge."""
    intra, inter = (
        Link.from_config(topology.intra_node, "allreduce"),
        Link.from_config(topology.inter_node, "allreduce"),
    )
    return ring_time("allreduce", intra, inter, nodes, g, nbytes)


def measured_comm(measured: dict | None) -> dict[str, float] | None:
    """The one-node run's communication phases: alltoall (the embedding exchange), allreduce (exposed)."""
    if measured is None:
        return None
    return {
        "alltoall": sum(measured.get(p, 0.0) for p in A2A_PHASES),
        "allreduce": measured.get("dense_allreduce", 0.0),
    }


def _comms(cfg: Config, tables, dense_params: int, g: int, b_local: float, n: int, sync_period: int) -> dict:
    """The model at n nodes: its config, comm_summary's times, the allreduce bytes, each sync mode's allreduce."""
    world = n * g
    cfg_n = replace(
        cfg,
        topology=replace(cfg.topology, nodes=n),
        data=replace(cfg.data, global_batch_size=int(b_local * world)),
    )
    comms = comm_summary(cfg_n, replace_shards(tables, world, g), world, g, dense_params)
    nbytes = comms["allreduce_bytes"]
    flat = flat_allreduce_time(cfg.topology, n, g, nbytes)
    intra = Link.from_config(cfg.topology.intra_node, "allreduce")
    inter = Link.from_config(cfg.topology.inter_node, "allreduce")
    backend = backend_of(cfg.topology)
    return {
        "cfg": cfg_n,
        "time_s": comms["time_s"],
        "allreduce_bytes": nbytes,
        "alltoall_bytes_inter_max": comms["alltoall_bytes_inter_max"],
        "allreduce": {
            "allreduce": flat,
            "hierarchical": two_level_time("allreduce", intra, inter, n, g, nbytes, backend) if nbytes else 0.0,
            "local_sgd": flat / sync_period,
        },
    }


def project(
    cfg: Config, tables, dense_params: int, g: int, node_counts: list[int], sync_period: int, measured=None
) -> list[dict]:
    """Model the step at every node count and sync mode.

    Args:
        cfg: the run's config.
        tables: the plan's tables (one node's).
        dense_params: dense parameters allreduced each step.
        g: ranks per node.
        node_counts: the N to project.
        sync_period: H, the local-SGD period.
        measured: a one-node run's per-phase seconds, or None for peak figures.

    Returns:
        One row per (N, sync mode): each phase's seconds, step_s and samples/s.
    """
    check_sync_period(sync_period)
    if measured is None:
        check_peak_figures(cfg)
    b_local = cfg.data.global_batch_size / g
    compute = compute_times(cfg, tables, dense_params, b_local, measured)
    comm_1 = measured_comm(measured)
    offset = {"alltoall": 0.0, **{m: 0.0 for m in SYNC_MODES}}  # measured - modelled at one node (CALIBRATION)
    if comm_1 is not None:
        one = _comms(cfg, tables, dense_params, g, b_local, 1, sync_period)
        offset["alltoall"] = comm_1["alltoall"] - one["time_s"]["alltoall_s"]
        ar = comm_1["allreduce"] - max(0.0, one["allreduce"]["allreduce"] - compute["backward"])
        offset.update(allreduce=ar, hierarchical=ar, local_sgd=ar / sync_period)
    rows = []
    for n in node_counts:
        c = _comms(cfg, tables, dense_params, g, b_local, n, sync_period)
        t, allreduce = c["time_s"], c["allreduce"]
        for mode in SYNC_MODES:
            exposed = max(0.0, allreduce[mode] - compute["backward"])
            phases = {
                "dense_compute": compute["dense"],
                "embedding_compute": compute["embedding"],
                "alltoall": max(0.0, t["alltoall_s"] + offset["alltoall"]),
                "allreduce_exposed": max(0.0, exposed + offset[mode]),
                "other": compute["other"],
            }
            step = sum(phases.values())
            rows.append(
                {
                    "nodes": n,
                    "ranks": n * g,
                    "global_batch": c["cfg"].data.global_batch_size,
                    "dense_sync": mode,
                    "sync_period": sync_period if mode == "local_sgd" else 1,
                    "step_s": step,
                    "samples_per_s": c["cfg"].data.global_batch_size / step,
                    "phase_s": phases,
                    "share": {k: v / step for k, v in phases.items()},
                    "comm_share": (phases["alltoall"] + phases["allreduce_exposed"]) / step,
                    "alltoall_intra_s": t["alltoall_intra_s"],
                    "alltoall_inter_s": t["alltoall_inter_s"],
                    "allreduce_s": allreduce[mode],
                    "backward_s": compute["backward"],
                    "calibration_s": {"alltoall": offset["alltoall"], "allreduce_exposed": offset[mode]},
                    "allreduce_bytes": c["allreduce_bytes"],
                    "alltoall_bytes_inter_max": c["alltoall_bytes_inter_max"],
                }
            )
    return rows


def tables_of(report: dict):
    """The `TablePlan` records of a plan report (`make_plan`'s dict)."""
    return [TablePlan(**{**t, "shards": [Shard(**s) for s in t["shards"]]}) for t in report["plan"]]


def plan_pair(cfg: Config, ranks_per_node, proposer: str, node_counts: list[int]) -> tuple[dict, dict[int, dict]]:
    """Plan one node and the largest node count, at the same per-rank batch.

    Returns:
        (the one-node plan report, {node count: its plan report}).
    """
    from dlrm.plan.planner import make_plan

    one = replace(cfg, topology=replace(cfg.topology, nodes=1))
    report = make_plan(one, ranks_per_node, proposer)
    planned = {1: report}
    for plan_nodes in sorted({1, max(node_counts)} - {1}):
        big = replace(
            cfg,
            topology=replace(cfg.topology, nodes=plan_nodes),
            data=replace(cfg.data, global_batch_size=cfg.data.global_batch_size * plan_nodes),
        )
        planned[plan_nodes] = make_plan(big, ranks_per_node, proposer)
    return report, planned


def best_rows(
    cfg: Config, report: dict, planned: dict[int, dict], node_counts: list[int], sync_period: int, measured
) -> list[dict]:
    """Each node count projected with every plan's sharding types; per node count and sync mode the
    faster row, `plan_nodes` saying whose plan."""
    one = replace(cfg, topology=replace(cfg.topology, nodes=1))
    g = report["topology"]["ranks_per_node"]
    dense = report["model"]["dense_params"]
    best = {}
    for plan_nodes, plan in sorted(planned.items()):
        for row in project(one, tables_of(plan), dense, g, node_counts, sync_period, measured):
            key = (row["nodes"], row["dense_sync"])
            if key not in best or row["step_s"] < best[key]["step_s"]:
                best[key] = {**row, "plan_nodes": plan_nodes}
    return [best[n, m] for n in node_counts for m in SYNC_MODES]


def scaling(cfg: Config, ranks_per_node, proposer: str, node_counts: list[int], sync_period: int, measured):
    """Plan one node and the largest node count, project every node count with each plan.

    Returns:
        (the one-node plan report, rows): per node count and sync mode the faster plan's row, its
        `plan_nodes` saying which plan.
    """
    check_sync_period(sync_period)  # before planning
    if measured is None:
        check_peak_figures(cfg)
    report, planned = plan_pair(cfg, ranks_per_node, proposer, node_counts)
    return report, best_rows(cfg, report, planned, node_counts, sync_period, measured)
