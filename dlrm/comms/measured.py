"""The trainer's measured communication beside the cost model's prediction for the same plan.

The core records what it measured (`summary["step_breakdown"]`: per rank `comm_s`, `comm_wait_s`, the
part spent waiting for the slowest rank, and `comm_behind_s`, the part spent behind a collective of
another kind; and `comm_critical_s`, the collectives' own time, from the last rank's entry to the last
rank's exit) and its plan; this module, outside the core, models the same plan and puts the
collectives' own time beside it (`summary["comm_vs_model"]`),
with the model's intra-node link fitted to a comms bench result when one is given
(trainer.comms_bench). `dlrm.train` attaches it to the Trainer as `summary_extras`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from dlrm.comms.costmodel import CommsError
from dlrm.comms.fit import fit_alpha_beta
from dlrm.comms.measure import base_collective
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
    """Measured seconds per step of the embedding exchange (alltoall, and reduce-scatter/allgather
    of row-wise shards) and of the dense allreduce, beside the cost model's for the same plan (`tables`,
    `dlrm.distributed.sharding.table_plans`), batch and topology. With a comms bench (trainer.comms_bench),
    the model's intra-node link takes the alpha and B fitted to the bench's alltoall (for the exchange)
    and allreduce (for the allreduce).

    measured, waits, behind, critical: the breakdown's comm_s (a rank's seconds in each kind, the mean
    over ranks), comm_wait_s (of them waiting for the last entry; a kind missing could not be told
    apart; None: not measured), comm_behind_s (behind another kind entered earlier) and comm_critical_s
    (the collectives' own seconds, all ranks in to all out, as the link serves them: `phases.Waits`).
    A rank can leave a collective while its peer still waits for its bytes, so a rank's transfer
    undercounts the collective that the model and `dlrm.comms.measure` price. Per row: total_s, wait_s,
    behind_s, transfer_s (a rank's: total less both), measured_s (the own time, compared), model_s
    (model_latency_s of it: the latency terms, `dlrm.comms.calibrate` scales the rest), ratio =
    measured_s / model_s, and `compared`: False, with `why`, where the ratio would mean nothing
    (placeholder figures that no comms bench replaces, no model figure, nothing ran, waiting not told
    apart); ratio is then None."""

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
    """`topology` with every link's (and collective's) bandwidth so high that the cost model's time is its
    latency terms alone."""
    fast = 1e15  # GB/s: n / B below 1e-18 s for any message here

    def link(cfg):
        own = {c: replace(x, bandwidth_GBps=fast) for c, x in cfg.collectives.items()}
        return replace(cfg, bandwidth_GBps=fast, collectives=own)

    return replace(topology, intra_node=link(topology.intra_node), inter_node=link(topology.inter_node))


def placeholder_links(topology, local_world_size: int) -> list[str]:
    """The links this run's collectives cross whose figures are placeholders (LinkConfig.placeholder):
    intra_node with several ranks per node, inter_node with several nodes."""
    used = [("intra_node", local_world_size > 1), ("inter_node", topology.nodes > 1)]
    return [key for key, crossed in used if crossed and getattr(topology, key).placeholder]


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
            cfg, tables, world.world_size, world.local_world_size, trainer.dense_params, bench,
            breakdown["comm_s"], breakdown.get("comm_wait_s"), breakdown.get("comm_behind_s"),
            breakdown.get("comm_critical_s"),
        )  # fmt: skip
        measured["slowest_rank"] = breakdown.get("slowest_rank")
        return {"comm_vs_model": measured}

    return extras
