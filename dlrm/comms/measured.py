"""The trainer's measured communication beside the cost model's prediction for the same plan.

The trainer records per rank the seconds spent in each kind of collective, the part waiting for the
slowest rank, the part behind another kind, and the collectives' own time (last rank in to last rank
out). This module models the same plan and puts that own time beside the model
(`summary["comm_vs_model"]`), the intra-node link optionally fitted to a comms bench result
(trainer.comms_bench).
"""

from __future__ import annotations

from dataclasses import replace

from dlrm.comms.costmodel import CommsError
from dlrm.comms.fit import fit_alpha_beta
from dlrm.comms.measure import base_collective
from dlrm.comms.report import load_bench
from dlrm.comms.traffic import comm_summary
from dlrm.config import Config
from dlrm.distributed.sharding import table_plans
from dlrm.distributed.world import World


def fitted_topology(topology, bench: dict, collective: str, ranks_per_node: int):
    """`topology` with its intra-node latency and bandwidth fitted to a comms bench result.

    Args:
        topology: the `TopologyConfig`.
        bench: a loaded bench.json.
        collective: whose rows to fit.
        ranks_per_node: the group size whose rows to fit.

    Raises:
        CommsError: the bench has no rows of that collective and size.
    """
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
            f"`torchrun --nproc_per_node={ranks_per_node} -m dlrm.comms.measure` with {collective} in its collectives"
        )
    fit = fit_alpha_beta(
        collective,
        topology.intra_node.fabric,
        ranks_per_node,
        [r["bytes"] for r in rows],
        [r["median_us"] * 1e-6 for r in rows],
    )
    link = replace(
        topology.intra_node, latency_us=fit.alpha_s * 1e6, bandwidth_GBps=fit.bandwidth_Bps / 1e9, placeholder=False
    )
    return replace(topology, intra_node=link)


EXCHANGE = ("alltoall", "reduce_scatter", "allgather")  # the embedding exchange's collectives


def comm_vs_model(
    cfg: Config,
    tables,
    world_size: int,
    local_world_size: int,
    dense_params: int,
    comms_bench: dict | None,
    measured: dict,
    waits: dict | None = None,
    behind: dict | None = None,
    critical: dict | None = None,
) -> dict:
    """Measured seconds per step of the embedding exchange and dense allreduce beside the model's.

    Args:
        cfg: the run's config (sharding precisions, topology, batch).
        tables: the plan's tables.
        world_size, local_world_size: the launch's shape.
        dense_params: dense parameters to allreduce.
        comms_bench: a loaded bench.json to fit the intra-node link to, or None.
        measured: a rank's seconds per kind of collective (mean over ranks).
        waits: of those, seconds waiting for the last rank to enter (None: not measured).
        behind: seconds behind a collective of another kind entered earlier.
        critical: the collectives' own seconds, all ranks in to all out.

    Returns:
        Per row ('embedding_exchange', 'dense_allreduce'): total_s, wait_s, behind_s, transfer_s,
        measured_s (the own time), model_s, model_latency_s, ratio = measured_s / model_s, and `compared`;
        where the ratio would mean nothing (placeholder figures, no model figure, nothing ran), compared
        is False with `why`, and ratio is None.
    """

    def model(collective: str, latency_only: bool = False) -> dict:
        topology = cfg.topology
        if comms_bench is not None:
            topology = fitted_topology(topology, comms_bench, collective, local_world_size)
        run_cfg = replace(cfg, topology=without_bandwidth_term(topology) if latency_only else topology)
        return comm_summary(run_cfg, tables, world_size, local_world_size, dense_params)["time_s"]

    out: dict = {}
    unmeasured = None if comms_bench is not None else placeholder_links(cfg.topology, local_world_size)
    for name, kinds, modelled, latency in (
        ("embedding_exchange", EXCHANGE, model("alltoall")["alltoall_s"], model("alltoall", True)["alltoall_s"]),
        ("dense_allreduce", ("allreduce",), model("allreduce")["allreduce_s"], model("allreduce", True)["allreduce_s"]),
    ):
        total = sum(measured.get(k, 0.0) for k in kinds)
        ran = [k for k in kinds if measured.get(k, 0.0) > 0]
        lost = [k for k in ran if waits is not None and k not in waits]
        wait = None if waits is None or lost else sum(waits.get(k, 0.0) for k in ran)
        queued = None if wait is None else sum((behind or {}).get(k, 0.0) for k in ran)
        transfer = None if wait is None else max(0.0, total - wait - (queued or 0.0))
        own = None if wait is None or critical is None else sum(critical.get(k, 0.0) for k in ran)
        why = None
        if unmeasured:
            why = (
                f"topology {cfg.topology.name}'s {' and '.join(unmeasured)} figures are placeholders: fit them on "
                "these machines with `python -m dlrm.comms.fit` (or mark measured ones placeholder: false), "
                "or give trainer.comms_bench"
            )
        elif not modelled:
            why = "the model sends nothing for this plan"
        elif not total:
            why = "no such collective ran in the profiled steps"
        elif lost:
            why = f"waiting could not be told from transfer: the ranks issued different {'/'.join(lost)} collectives"
        elif own is None:
            why = "the collectives' own time (last entry to last exit) was not measured"
        out[name] = {"total_s": total, "wait_s": wait, "behind_s": queued, "transfer_s": transfer,
                     "measured_s": own, "model_s": modelled, "model_latency_s": latency,
                     "ratio": own / modelled if why is None and own is not None else None,
                     "compared": why is None} | ({} if why is None else {"why": why})  # fmt: skip
    out["model"] = f"fitted to {cfg.trainer.comms_bench}" if comms_bench is not None else "topology config"
    return out


def without_bandwidth_term(topology):
    """`topology` with bandwidths so high that the model's time is its latency terms alone."""
    fast = 1e15  # GB/s: n / B below 1e-18 s for any message here

    def link(cfg):
        own = {c: replace(x, bandwidth_GBps=fast) for c, x in cfg.collectives.items()}
        return replace(cfg, bandwidth_GBps=fast, collectives=own)

    return replace(topology, intra_node=link(topology.intra_node), inter_node=link(topology.inter_node))


def placeholder_links(topology, local_world_size: int) -> list[str]:
    """The links this run's collectives cross whose figures are placeholders."""
    used = [("intra_node", local_world_size > 1), ("inter_node", topology.nodes > 1)]
    return [key for key, crossed in used if crossed and getattr(topology, key).placeholder]


def checked_bench(cfg: Config, local_world_size: int) -> dict | None:
    """The trainer.comms_bench file, read and fitted before any training (None without one).

    Raises:
        CommsError: the comms bench file is unusable.
    """
    bench = load_bench(cfg.trainer.comms_bench) if cfg.trainer.comms_bench else None
    if bench is not None:
        fitted_topology(cfg.topology, bench, "alltoall", local_world_size)  # fails now, not after the run
    return bench


class CommVsModel:
    """The summary's comm_vs_model: a run's measured communication beside the cost model's (`summary_fields`).

    Args:
        cfg: the run's config (its model, topology and trainer.comms_bench).
        world: this rank and the launcher's sizes.
        plan: the sharding plan trained.
        dense_params: the dense parameters the allreduce carries.
        bench: `checked_bench`'s result.
    """

    def __init__(self, cfg: Config, world: World, plan, dense_params: int, bench: dict | None) -> None:
        self.cfg, self.world, self.plan, self.dense_params, self.bench = cfg, world, plan, dense_params, bench

    def summary_fields(self, summary: dict) -> dict:
        """{"comm_vs_model": ...} when the summary holds a step breakdown; else {}."""
        breakdown = summary.get("step_breakdown")
        if breakdown is None:
            return {}
        world = self.world
        tables = table_plans(self.plan, self.cfg.model, world.world_size)
        measured = comm_vs_model(
            self.cfg, tables, world.world_size, world.local_world_size, self.dense_params, self.bench,
            breakdown["comm_s"], breakdown.get("comm_wait_s"), breakdown.get("comm_behind_s"),
            breakdown.get("comm_critical_s"),
        )  # fmt: skip
        measured["slowest_rank"] = breakdown.get("slowest_rank")
        return {"comm_vs_model": measured}
