"""The model side of the cluster experiments: the cost model's time for each benchmark row, the planner's
`--scale --measured` projection, and comm_vs_model's modelled seconds.

`remodel` re-evaluates all three with the current model against the stored measurements (`--render`),
keeping the run's own figures (`model_s_at_run`, `projections_at_run`, `comm_model_s_at_run`) and
recording what it redid in `results["remodelled"]`. Where a run's files are gone, its stored figures stay.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from dlrm.distributed.plan_records import Shard, TablePlan

MODEL_PLAN_SYNC_PERIOD = 4  # dlrm.plan --sync-period's default, as run_plan calls it
PROPOSER = "default"  # dlrm.plan --proposer's default


# --- collectives ---------------------------------------------------------------------------------------


def emulated_topology(gbit: float, nodes: int, ranks_per_node: int):
    """The emulated topology emu_{nodes}x{ranks_per_node} at this uplink rate, as the emulated cluster sets it."""
    from dlrm.config.compose import compose

    overrides = [f"topology=emu_{nodes}x{ranks_per_node}"]
    link = compose(overrides).topology.inter_node
    return compose(overrides + link.rate_overrides("topology.inter_node", gbit / 8 / ranks_per_node)).topology


def comms_model_links(gbit: float, nodes: int, ranks_per_node: int):
    """(topology, backend) of the model of the emulated topology at this uplink rate (`emulated_topology`)."""
    from dlrm.comms.costmodel import backend_of

    topo = emulated_topology(gbit, nodes, ranks_per_node)
    return topo, backend_of(topo)


def model_time(links, collective: str, scope: str, group_size: int, nodes: int, nbytes: float) -> float:
    """The cost model's seconds for one benchmark row.

    Args:
        links: (topology, backend) from `comms_model_links`.
        collective: the benchmark's collective.
        scope: 'world' (spans the nodes), 'intra' or 'inter' (one level).
        group_size: ranks in one group of the scope.
        nodes: nodes of the job.
        nbytes: the message size.
    """
    from dlrm.comms.costmodel import Link, level_time, world_time

    topo, backend = links
    intra, inter = Link.from_config(topo.intra_node, collective), Link.from_config(topo.inter_node, collective)
    if scope == "world":
        return world_time(collective, intra, inter, nodes, group_size // nodes, nbytes, backend)
    return level_time(collective, intra if scope == "intra" else inter, group_size, nbytes, backend)


def comms_rows(bench: dict, gbit: float, links) -> list[dict]:
    """Per measured size: the cost model's time for the same collective, scope and size."""
    from dlrm.comms.measure import base_collective

    nodes = bench["nodes"]
    rows = []
    for r in bench["results"]:
        c, scope, p, n = base_collective(r["collective"]), r["scope"], r["group_size"], r["bytes"]
        model = model_time(links, c, scope, p, nodes, n)
        rows.append({"gbit": gbit, "collective": c, "scope": scope, "group_size": p, "bytes": n, "nodes": nodes,
                     "measured_s": r["median_us"] * 1e-6, "model_s": model})  # fmt: skip
    return rows


def remodel_comms(results: dict) -> int:
    """Every stored benchmark row's model_s from the current model; rows re-modelled."""
    shape = {r["gbit"]: (r["nodes"], r["ranks_per_node"]) for r in results.get("runs", []) if r.get("kind") == "comms"}
    links: dict[tuple, tuple] = {}
    for row in results.get("comms", []):
        nodes, rpn = shape.get(row["gbit"], (row.get("nodes", 2), 2))  # the benchmark runs on 2 x 2
        if (row["gbit"], nodes, rpn) not in links:
            links[row["gbit"], nodes, rpn] = comms_model_links(row["gbit"], nodes, rpn)
        row.setdefault("model_s_at_run", row["model_s"])
        c, scope, p, n = row["collective"], row["scope"], row["group_size"], row["bytes"]
        row["model_s"] = model_time(links[row["gbit"], nodes, rpn], c, scope, p, nodes, n)
    return len(results.get("comms", []))


# --- the --scale projection ------------------------------------------------------------------------------


def emulated_name(nodes: int, ranks_per_node: int) -> str:
    """The emulated topology fitted on this shape (conf/topology/emu_NxR.yaml: what each collective reaches
    of the uplink depends on the ranks it spans), else the one with its ranks per node (emu_4x1, emu_2x2),
    which a run resizes with topology.nodes."""
    from dlrm.config.compose import CONF_DIR

    name = f"emu_{nodes}x{ranks_per_node}"
    if (CONF_DIR / "topology" / f"{name}.yaml").is_file():
        return name
    return "emu_2x2" if ranks_per_node == 2 else "emu_4x1"


def plan_overrides(
    model: str, batch_per_rank: int, gbit: float, series: str, shape: tuple[int, int] = (2, 2)
) -> tuple[list[str], str]:
    """The planner's overrides and `--scale` node counts for the projection calibrated on `series`.

    Args:
        series: the one-node calibration, "1x1" or "1x2" (ranks per node last).
        shape: the train experiment's (nodes, ranks per node); its topology is used where its ranks per
            node match the series', else emu_4x1 (1, 2 and 4 nodes) or emu_2x2 (1 and 2).

    Returns:
        (overrides, node counts as "1,N" or "1,2,4").
    """
    from dlrm.config.compose import compose

    rpn = int(series[-1])
    nodes = shape[0] if shape[1] == rpn else (4 if rpn == 1 else 2)
    topology = emulated_name(nodes, rpn)
    counts = "1,2,4" if nodes == 4 else f"1,{nodes}"
    link = compose([f"topology={topology}"]).topology.inter_node
    overrides = [
        f"model={model}",
        f"topology={topology}",
        "topology.nodes=1",
        *link.rate_overrides("topology.inter_node", gbit / 8 / rpn),
        f"data.global_batch_size={batch_per_rank * rpn}",
    ]
    return overrides, counts


def projection_rows(plan: dict, round_index: int, gbit: float, series: str) -> list[dict]:
    """One results row per node count of a planner scaling report (`--json --scale`), one node included."""
    rows = []
    for r in plan["scaling"]:
        if r["nodes"] >= 1:
            share = r.get("share", {})
            rows.append({"round": round_index, "gbit": gbit, "series": series, "nodes": r["nodes"],
                         "dense_sync": r["dense_sync"], "step_s": r["step_s"], "a2a_share": share.get("alltoall"),
                         "allreduce_share": share.get("allreduce_exposed")})  # fmt: skip
    return rows


def remodel_projections(results: dict) -> int:
    """The projections again, in process, from each round's calibration run; projections redone (0: none
    could be, the stored ones stay)."""
    from dlrm.config.compose import compose
    from dlrm.plan.projection import best_rows, load_measured, parse_scale, plan_pair

    o = results.get("options", {})
    gbits = sorted({p["gbit"] for p in results.get("projections", [])})
    calibrations = [
        (r["round"], f"1x{r['ranks_per_node']}", Path(r["run_dir"]) / "summary.json")
        for r in results.get("runs", [])
        if r.get("kind") == "train" and r.get("ok") and r["nodes"] == 1 and r.get("run_dir")
    ]
    calibrations = [c for c in calibrations if c[2].is_file()]
    if not gbits or not calibrations or "model" not in o or "batch_per_rank" not in o:
        return 0
    rows: list[dict] = []
    for series in sorted({s for _, s, _ in calibrations}):
        for g in gbits:
            overrides, counts = plan_overrides(
                o["model"], o["batch_per_rank"], g, series, tuple(o.get("shape", (2, 2)))
            )
            cfg, node_counts = compose(overrides), parse_scale(counts)
            report, planned = plan_pair(cfg, None, PROPOSER, node_counts)
            for k, s, path in calibrations:
                if s == series:
                    scaled = best_rows(
                        cfg, report, planned, node_counts, MODEL_PLAN_SYNC_PERIOD, load_measured(str(path))
                    )
                    rows += projection_rows({"scaling": scaled}, k, g, series)
    results.setdefault("projections_at_run", results.get("projections", []))
    results["projections"] = rows
    return len(rows)


# --- comm_vs_model -------------------------------------------------------------------------------------


def tables_from_summary(summary: dict, model) -> list:
    """The `TablePlan`s of a run from its summary's sharding_plan and its model config.

    Row-sharded tables split into equal row blocks over their ranks (ceil(rows / k)), column-wise ones into
    equal column blocks, data-parallel ones replicated: exact where the ranks divide the rows or columns.
    """
    plan = {e["table"]: e for e in summary["sharding_plan"]}
    world = summary["world_size"]
    out = []
    for t in model.tables:
        e = plan[t.name]
        kind, ranks = e["sharding_type"], list(e["ranks"]) or list(range(world))
        k = len(ranks)
        if kind == "data_parallel":
            shards = [Shard(r, 0, 0, t.rows, t.dim) for r in range(world)]
        elif kind in ("row_wise", "table_row_wise", "grid_shard"):
            block = math.ceil(t.rows / k)
            shards = [Shard(r, i * block, 0, max(0, min(t.rows, (i + 1) * block) - i * block), t.dim)
                      for i, r in enumerate(ranks)]  # fmt: skip
        elif kind in ("column_wise", "table_column_wise"):
            bounds = [round(i * t.dim / k) for i in range(k + 1)]
            shards = [Shard(r, 0, bounds[i], t.rows, bounds[i + 1] - bounds[i]) for i, r in enumerate(ranks)]
        else:  # table_wise
            shards = [Shard(ranks[0], 0, 0, t.rows, t.dim)]
        out.append(
            TablePlan(table=t.name, rows=t.rows, dim=t.dim, features=len(t.features), pooling=t.pooling,
                      sharding_type=kind, compute_kernel=e.get("compute_kernel", ""), cache_load_factor=None,
                      ranks=sorted({s.rank for s in shards}), shards=shards)
        )  # fmt: skip
    return out


def remodel_comm_vs_model(results: dict) -> int:
    """comm_vs_model's modelled seconds of every kept multi-rank training run, from the current model.

    Returns:
        How many runs were re-modelled.
    """
    from omegaconf import DictConfig, OmegaConf

    from dlrm.common.io import JSON_LIMIT, parse_json, read_bounded
    from dlrm.comms.measured import comm_vs_model
    from dlrm.config import to_config
    from dlrm.distributed.capacity import dense_param_count
    from dlrm.models.dlrm import build_model

    dense: dict[str, int] = {}
    done = 0
    for rec in results.get("runs", []):
        run_dir = Path(rec.get("run_dir", ""))
        if rec.get("kind") != "train" or not rec.get("ok") or rec["nodes"] * rec["ranks_per_node"] < 2:
            continue
        if not (run_dir / "summary.json").is_file() or not (run_dir / "config.yaml").is_file():
            continue
        summary = parse_json(read_bounded(run_dir / "summary.json", JSON_LIMIT))
        breakdown = summary.get("step_breakdown")
        if (
            not breakdown
            or "sharding_plan" not in summary
            or summary.get("comm_vs_model", {}).get("model")
            not in (
                None,
                "topology config",
            )
        ):
            continue  # fitted to a comms bench (trainer.comms_bench): not redone here
        loaded = OmegaConf.load(run_dir / "config.yaml")
        if not isinstance(loaded, DictConfig):
            continue
        cfg = to_config(loaded)
        key = repr(cfg.model)
        if key not in dense:
            dense[key] = dense_param_count(build_model(cfg.model))
        tables = tables_from_summary(summary, cfg.model)
        got = comm_vs_model(
            cfg, tables, summary["world_size"], rec["ranks_per_node"], dense[key], None, breakdown["comm_s"]
        )
        rec.setdefault("comm_model_s_at_run", rec.get("comm_model_s", {}))
        rec["comm_model_s"] = {k: v["model_s"] for k, v in got.items() if isinstance(v, dict)}
        done += 1
    return done


def remodel(results: dict, say=print) -> dict:
    """Re-evaluate the model side of `results` in place (module docstring); returns results["remodelled"]."""
    done: dict[str, str | int] = {"at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    for what, fn in (
        ("comms_rows", remodel_comms),
        ("projections", remodel_projections),
        ("comm_vs_model_runs", remodel_comm_vs_model),
    ):
        try:
            done[what] = fn(results)
        except (OSError, ValueError, KeyError) as e:  # unreadable files: keep the stored figures
            say(f"--render: could not re-model {what} ({e}); kept the stored figures")
            done[what] = 0
    results["remodelled"] = done
    return done
