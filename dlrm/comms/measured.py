"""The trainer's measured communication beside the cost model's prediction for the same plan.

The core records what it measured (`summary["step_breakdown"]["comm_s"]`) and its plan; this module,
outside the core, models the same plan and puts the two side by side (`summary["comm_vs_model"]`),
with the model's intra-node link fitted to a comms bench result when one is given
(trainer.comms_bench). `dlrm.train` attaches it to the Trainer as `summary_extras`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dlrm.comms.bench import base_collective
from dlrm.comms.costmodel import CommsError, fit_alpha_beta
from dlrm.comms.report import load_bench
from dlrm.comms.traffic import comm_summary
from dlrm.config import Config
from dlrm.distributed.sharding import table_plans


def fitted_topology(topology, bench: dict, collective: str, ranks_per_node: int):
    """`topology` (a TopologyConfig) with its intra-node link's latency and bandwidth replaced by the
    alpha and B fitted to `collective`'s rows of a comms bench result (`dlrm.comms.report.load_bench`)
    among `ranks_per_node` ranks; CommsError if the bench has no such rows."""
    rows = [
        r
        for r in bench["results"]
        if base_collective(r["collective"]) == collective
        and r["scope"] in ("intra", "world")
        and r["group_size"] == ranks_per_node
    ]
    if len({r["bytes"] for r in rows}) < 2:
        raise CommsError(
            f"the comms bench file has no {collective} times at two sizes among {ranks_per_node} ranks; rerun "
            f"`torchrun --nproc_per_node={ranks_per_node} -m dlrm.comms.bench` with {collective} in its collectives"
        )
    fit = fit_alpha_beta(
        collective,
        topology.intra_node.fabric,
        ranks_per_node,
        [r["bytes"] for r in rows],
        [r["median_us"] * 1e-6 for r in rows],
    )
    link = replace(topology.intra_node, latency_us=fit.alpha_s * 1e6, bandwidth_GBps=fit.bandwidth_Bps / 1e9)
    return replace(topology, intra_node=link)


def comm_vs_model(
    cfg: Config,
    tables,
    world_size: int,
    local_world_size: int,
    dense_params: int,
    comms_bench: dict | None,
    measured: dict,
) -> dict:
    """Measured seconds per step of the embedding exchange (alltoall, and reduce-scatter/allgather
    of row-wise shards) and of the dense allreduce, beside the cost model's for the same plan (`tables`,
    `dlrm.distributed.sharding.table_plans`), batch and topology; ratio = measured / modelled (None where the
    model predicts 0). With a comms bench (trainer.comms_bench), the model's intra-node link takes the
    alpha and B fitted to the bench's alltoall (for the exchange) and allreduce (for the allreduce)."""

    def model(collective: str) -> dict:
        run_cfg = cfg
        if comms_bench is not None:
            run_cfg = replace(cfg, topology=fitted_topology(cfg.topology, comms_bench, collective, local_world_size))
        return comm_summary(run_cfg, tables, world_size, local_world_size, dense_params)["time_s"]

    out = {}
    for name, seconds, modelled in (
        (
            "embedding_exchange",
            measured["alltoall"] + measured["reduce_scatter"] + measured["allgather"],
            model("alltoall")["alltoall_s"],
        ),
        ("dense_allreduce", measured["allreduce"], model("allreduce")["allreduce_s"]),
    ):
        out[name] = {"measured_s": seconds, "model_s": modelled, "ratio": seconds / modelled if modelled else None}
    out["model"] = f"fitted to {cfg.trainer.comms_bench}" if comms_bench is not None else "topology config"
    return out


def summary_extras(cfg: Config, local_world_size: int) -> Callable[..., dict]:
    """What `Trainer(summary_extras=...)` adds to the summary: comm_vs_model, when the run measured a
    step breakdown. A trainer.comms_bench file is read and fitted here, before any training (its errors
    are CommsError, one line)."""
    bench = load_bench(cfg.trainer.comms_bench) if cfg.trainer.comms_bench else None
    if bench is not None:
        fitted_topology(cfg.topology, bench, "alltoall", local_world_size)  # fails now, not after the run

    def extras(trainer, summary: dict) -> dict:
        breakdown = summary.get("step_breakdown")
        if breakdown is None:
            return {}
        world = trainer.world
        tables = table_plans(trainer.plan, cfg.model, world.world_size)
        measured = comm_vs_model(
            cfg, tables, world.world_size, world.local_world_size, trainer.dense_params, bench, breakdown["comm_s"]
        )
        return {"comm_vs_model": measured}

    return extras
