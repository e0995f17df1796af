# long file: the alpha-beta model of every fabric and collective, one concept
"""Alpha-beta cost model of collectives on a ring, a fully connected topology and a switch.

Every estimate is ``T = steps * alpha + factor * n / B``: n the message size in bytes as nccl-tests
counts it, p the ranks taking part, alpha the latency per message (s), B the unidirectional bandwidth per
rank (bytes/s); (steps, factor) depend on the collective, the fabric, p and the backend (NCCL or Gloo).
Two levels (N nodes x g ranks) combine an intra-node and an inter-node link.
"""

# The derivation of every case: docs/design/cost-model.md.
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dlrm.common.errors import UserError
from dlrm.config.choices import Fabric

COLLECTIVES = ("allreduce", "alltoall", "reduce_scatter", "allgather")
FABRICS = tuple(Fabric)  # the topology config's choices
BACKENDS = ("gloo", "nccl")  # the topology config's backend once 'auto' is resolved (backend_of)


class CommsError(UserError, ValueError):
    """Bad input to the comms benchmark or model; the message names the value and the fix."""

    same_on_all_ranks = True  # arguments and files every rank reads alike


@dataclass(frozen=True)
class Link:
    """One level of the interconnect: fabric, per-message latency alpha (s), bandwidth per rank (bytes/s)."""

    fabric: str
    alpha_s: float
    bandwidth_Bps: float

    @classmethod
    def from_config(cls, link, collective: str | None = None) -> Link:
        """From a `LinkConfig` (latency_us, bandwidth_GBps with 1 GB = 1e9 bytes); with `collective`,
        that collective's own figures where the link has them (`LinkConfig.collectives`)."""
        own = (getattr(link, "collectives", None) or {}).get(collective) if collective else None
        figures = own if own is not None else link
        return cls(link.fabric, figures.latency_us * 1e-6, figures.bandwidth_GBps * 1e9)


def check_collective(collective: str) -> None:
    """CommsError unless `collective` is one the model knows."""
    if collective not in COLLECTIVES:
        raise CommsError(f"unknown collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")


def check_fabric(fabric: str) -> None:
    """CommsError unless `fabric` is one the model knows."""
    if fabric not in FABRICS:
        raise CommsError(f"unknown fabric {fabric!r}: choose one of {', '.join(FABRICS)}")


def check_backend(backend: str) -> None:
    """CommsError unless `backend` is one the model knows."""
    if backend not in BACKENDS:
        raise CommsError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def backend_of(topology) -> str:
    """The backend ('nccl' or 'gloo') of a `TopologyConfig`: 'auto' is NCCL on cuda and Gloo on cpu."""
    backend = str(topology.backend)
    if backend == "auto":
        return "nccl" if str(topology.device) == "cuda" else "gloo"
    return backend


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests' busbw / algbw: 2(p-1)/p for allreduce, (p-1)/p for the others."""
    check_collective(collective)
    base = (p - 1) / p
    return 2 * base if collective == "allreduce" else base


def coefficients(collective: str, fabric: str, p: int) -> tuple[float, float]:
    """(steps, factor) of one collective among p ranks on `fabric`, as NCCL runs it.

    Returns:
        (steps, factor) with T = steps * alpha + factor * n / B.
    """
    check_collective(collective)
    check_fabric(fabric)
    if p < 1:
        raise CommsError(f"rank count p={p} must be at least 1")
    if p == 1:
        return 0.0, 0.0
    if collective == "alltoall":
        if fabric == "ring":
            return p - 1, (p - 1) / 2
        if fabric == "fully_connected":
            return 1, (p - 1) / p
        return p - 1, (p - 1) / p
    steps = {"ring": p - 1, "fully_connected": 1, "switch": math.ceil(math.log2(p))}[fabric]
    factor = (p - 1) / p
    if collective == "allreduce":
        return 2 * steps, 2 * factor
    return steps, factor


def collective_time(collective: str, link: Link, p: int, nbytes: float) -> float:
    """Seconds for one collective of `nbytes` (nccl-tests' message size) among p ranks on one level."""
    if nbytes < 0:
        raise CommsError(f"message size {nbytes} bytes is negative; pass a size >= 0")
    steps, factor = coefficients(collective, link.fabric, p)
    return steps * link.alpha_s + factor * nbytes / link.bandwidth_Bps


def level_time(collective: str, link: Link, p: int, nbytes: float, backend: str = "nccl") -> float:
    """Seconds for one collective among p ranks on one level, as `backend` runs it.

    NCCL follows the fabric's formula; Gloo runs allreduce and allgather as rings on any fabric, its
    reduce-scatter as an allreduce and its alltoall by the fabric's formula.
    """
    check_collective(collective)
    check_backend(backend)
    if backend == "gloo" and collective != "alltoall":
        ran = "allreduce" if collective == "reduce_scatter" else collective
        return collective_time(ran, replace(link, fabric="ring"), p, nbytes)
    return collective_time(collective, link, p, nbytes)


def _shape(nodes: int, ranks_per_node: int) -> tuple[int, int]:
    """(nodes, ranks_per_node), refused unless both are at least 1."""
    if nodes < 1 or ranks_per_node < 1:
        raise CommsError(f"nodes={nodes} and ranks_per_node={ranks_per_node} must both be at least 1")
    return nodes, ranks_per_node


def two_level_time(
    collective: str,
    intra: Link,
    inter: Link,
    nodes: int,
    ranks_per_node: int,
    nbytes: float,
    backend: str = "nccl",
) -> float:
    """Seconds for one collective over nodes x ranks_per_node ranks by the hierarchical scheme.

    Allreduce: intra reduce-scatter, inter allreduce of n/g, intra allgather. Alltoall: the intra and
    inter parts run concurrently, T = max of the two. Each level's collective as `backend` runs it.
    """
    check_collective(collective)
    n, g = _shape(nodes, ranks_per_node)

    def level(c: str, link: Link, p: int, size: float) -> float:
        return level_time(c, link, p, size, backend)

    if collective == "allreduce":
        return (
            level("reduce_scatter", intra, g, nbytes)
            + level("allreduce", inter, n, nbytes / g)
            + level("allgather", intra, g, nbytes)
        )
    if collective == "alltoall":
        return max(level("alltoall", intra, g, nbytes / n), level("alltoall", inter, n, nbytes))
    # reduce-scatter (allgather mirrors it): intra reduce-scatter of n, then inter reduce-scatter of n/g.
    return level(collective, intra, g, nbytes) + level(collective, inter, n, nbytes / g)


def ring_time(collective: str, intra: Link, inter: Link, nodes: int, ranks_per_node: int, nbytes: float) -> float:
    """Seconds for one flat ring collective over all nodes x ranks_per_node ranks, in rank order.

    The ring's (steps, factor) for p = N g; each step at the largest alpha of the levels it crosses, the
    bandwidth term at min(B_intra, g B_inter). Allreduce, reduce-scatter and allgather only.
    """
    check_collective(collective)
    n, g = _shape(nodes, ranks_per_node)
    if collective == "alltoall":
        raise CommsError("no backend here runs alltoall as a ring; use world_time or two_level_time")
    levels = ([intra] if g > 1 else []) + ([replace(inter, bandwidth_Bps=g * inter.bandwidth_Bps)] if n > 1 else [])
    if not levels:
        return 0.0
    slowest = Link("ring", max(x.alpha_s for x in levels), min(x.bandwidth_Bps for x in levels))
    return collective_time(collective, slowest, n * g, nbytes)


def world_time(
    collective: str,
    intra: Link,
    inter: Link,
    nodes: int,
    ranks_per_node: int,
    nbytes: float,
    backend: str = "nccl",
) -> float:
    """Seconds for one collective over all ranks in one process group, as `backend` runs it.

    NCCL: `two_level_time`. Gloo: alltoall as `two_level_time`, allreduce and allgather as one flat ring
    (`ring_time`), reduce-scatter as that ring's allreduce.
    """
    check_collective(collective)
    check_backend(backend)
    if backend == "nccl" or collective == "alltoall":
        return two_level_time(collective, intra, inter, nodes, ranks_per_node, nbytes, backend)
    ran = "allreduce" if collective == "reduce_scatter" else collective
    return ring_time(ran, intra, inter, nodes, ranks_per_node, nbytes)


def _check_step_inputs(
    g: int, nodes: int, a2a_intra: float, a2a_inter: float, allreduce: float, dense_allreduce: str
) -> None:
    """`step_comm_time`'s inputs: bytes >= 0, none across a level that does not exist, a known scheme."""
    if dense_allreduce not in ("flat", "hierarchical"):
        raise CommsError(f"dense_allreduce={dense_allreduce!r}: choose flat or hierarchical")
    for key, value in (
        ("alltoall_bytes_intra", a2a_intra),
        ("alltoall_bytes_inter", a2a_inter),
        ("allreduce_bytes", allreduce),
    ):
        if value < 0:
            raise CommsError(f"{key}={value} is negative; pass bytes per rank per iteration (>= 0)")
    if g == 1 and a2a_intra:
        raise CommsError(f"alltoall_bytes_intra={a2a_intra} but a node holds one rank; pass 0")
    if nodes == 1 and a2a_inter:
        raise CommsError(f"alltoall_bytes_inter={a2a_inter} but topology.nodes=1; pass 0")


def step_comm_time(
    topology,
    alltoall_bytes_intra: float,
    alltoall_bytes_inter: float,
    allreduce_bytes: float,
    ranks_per_node: int | None = None,
    alltoall_count: int = 1,
    allreduce_count: int = 1,
    dense_allreduce: str = "flat",
) -> dict[str, float]:
    """Estimated communication seconds of one training iteration on a `TopologyConfig`.

    Byte counts are per rank and per iteration, forward and backward together. A ring carries a byte p/2
    times on average (p = ranks at that level); fully connected and switch carry it once.

    Args:
        topology: the `TopologyConfig`.
        alltoall_bytes_intra: bytes this rank sends by alltoall to other ranks of its node.
        alltoall_bytes_inter: bytes this rank sends by alltoall to ranks on other nodes.
        allreduce_bytes: size of the allreduced buffer (dense gradients: parameters x 4 for fp32).
        ranks_per_node: needed when topology.ranks_per_node is None (pass LOCAL_WORLD_SIZE).
        alltoall_count, allreduce_count: collectives issued per iteration (each pays its latency).
        dense_allreduce: "flat" (one allreduce over all ranks) or "hierarchical" (two levels).

    Returns:
        Seconds under alltoall_intra_s, alltoall_inter_s, alltoall_s (the max: they run concurrently),
        allreduce_s and total_s (alltoall + allreduce, no overlap with compute assumed).

    Raises:
        CommsError: negative bytes, bytes across a level that does not exist, an unknown scheme, or
            ranks_per_node missing.
    """
    g = ranks_per_node or topology.ranks_per_node
    if not g:
        raise CommsError(
            f"topology {topology.name!r} has ranks_per_node=None (taken from the launcher); "
            "pass ranks_per_node=LOCAL_WORLD_SIZE"
        )
    nodes, backend = topology.nodes, backend_of(topology)
    _check_step_inputs(g, nodes, alltoall_bytes_intra, alltoall_bytes_inter, allreduce_bytes, dense_allreduce)
    intra = Link.from_config(topology.intra_node, "alltoall")
    inter = Link.from_config(topology.inter_node, "alltoall")

    def sent_time(link: Link, p: int, sent: float, count: int) -> float:
        if p == 1 or sent == 0:
            return 0.0
        steps, _ = coefficients("alltoall", link.fabric, p)
        hops = p / 2 if link.fabric == "ring" else 1.0
        return count * steps * link.alpha_s + sent * hops / link.bandwidth_Bps

    a2a_intra = sent_time(intra, g, alltoall_bytes_intra, alltoall_count)
    a2a_inter = sent_time(inter, nodes, alltoall_bytes_inter, alltoall_count)
    allreduce = 0.0
    if allreduce_bytes:
        intra = Link.from_config(topology.intra_node, "allreduce")
        inter = Link.from_config(topology.inter_node, "allreduce")
        timed = world_time if dense_allreduce == "flat" else two_level_time
        one = timed("allreduce", intra, inter, nodes, g, allreduce_bytes / allreduce_count, backend)
        allreduce = allreduce_count * one
    alltoall = max(a2a_intra, a2a_inter)
    return {
        "alltoall_intra_s": a2a_intra,
        "alltoall_inter_s": a2a_inter,
        "alltoall_s": alltoall,
        "allreduce_s": allreduce,
        "total_s": alltoall + allreduce,
    }
