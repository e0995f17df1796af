# long file: the alpha-beta model of every fabric and collective, one concept
"""Alpha-beta cost model of collectives on a ring, a fully connected topology and a switch.

Every estimate has the form ``T = steps * alpha + factor * n / B`` where

- ``n``: message size in bytes, as nccl-tests counts it: the per-rank buffer of allreduce, the per-rank
  send buffer of alltoall (n/p to each rank, itself included), the per-rank *input* of reduce-scatter
  and the per-rank *output* of allgather;
- ``p``: ranks taking part;
- ``alpha``: latency per message (s), paid once per step; messages sent in the same step overlap;
- ``B``: unidirectional bandwidth per rank (bytes/s), all of its links together (as `LinkConfig`);
- ``steps`` and ``factor`` depend on the collective, the fabric and p (`coefficients`).

Fabrics (each rank injects at most B bytes/s in total):

- ``ring``: one link per rank, to the next rank, bandwidth B; one message per step.
  allreduce = reduce-scatter + allgather, each p-1 steps of n/p bytes: 2(p-1) alpha + 2(p-1)/p n/B.
  alltoall: chunk for distance d travels d hops (store and forward, p-1 steps); the busiest link carries
  sum_d d n/p = (p-1)/2 n bytes: (p-1) alpha + (p-1)/2 n/B.
- ``fully_connected``: p-1 links per rank, B/(p-1) each, all sending at once (one step).
  alltoall: n/p to each peer on its own link: alpha + (p-1)/p n/B.
  reduce-scatter / allgather: direct, one step: alpha + (p-1)/p n/B; allreduce twice that.
- ``switch``: one non-blocking port per rank of bandwidth B; any rank reaches any other in one hop.
  alltoall: p-1 messages leave through the port one after the other: (p-1) alpha + (p-1)/p n/B.
  reduce-scatter / allgather: recursive halving / doubling, ceil(log2 p) steps: ceil(log2 p) alpha
  + (p-1)/p n/B; allreduce twice that (Rabenseifner).

The bandwidth factor of every bandwidth-optimal case equals nccl-tests' busbw factor (2(p-1)/p for
allreduce, (p-1)/p otherwise), so a measured busbw estimates B once n is large.

Two levels (scale-out, `two_level_time`): N nodes x g ranks per node, p = N g. Hierarchical allreduce =
intra reduce-scatter(n) + inter allreduce(n/g, among the N ranks of one local index) + intra
allgather(n). Alltoall: the intra-node part, alltoall(n/N) among g, and the inter-node part,
alltoall(n) among N over the NIC, run concurrently on separate links, so T = max(intra, inter); the
inter part counts one message per remote node (messages to one node's ranks are aggregated).

Backends (`level_time`, `world_time`; `backend_of` reads a topology's): the formulas above are NCCL's
(each fabric its algorithm). Gloo runs other algorithms, whatever the fabric:

- allreduce and allgather: a ring over the group's ranks in rank order (gloo/allreduce.cc,
  gloo/allgather.cc), so the ring's steps and factors: 2(p-1) alpha + 2(p-1)/p n/B and
  (p-1) alpha + (p-1)/p n/B;
- reduce-scatter: a whole allreduce of the input, of which each rank keeps its chunk (torch's
  ProcessGroupGloo::reduce_scatter_tensor_coalesced), so 2(p-1) alpha + 2(p-1)/p n/B, twice the
  bandwidth term of a reduce-scatter;
- alltoall: direct sends to every peer, all posted at once: the fabric's formula;
- over N nodes x g ranks (the `world` of the trainer, DDP's flat allreduce): no two-level scheme but
  one flat ring over all p = N g ranks (`ring_time`). A node's ranks are consecutive, so the ring
  enters and leaves each node once: its uplink carries one ring edge each way, 2(p-1)/p n bytes for
  an allreduce (1.5 n at 2 x 2), at the node's whole inter-node rate g B_inter (its g ranks share the
  uplink, and no other edge uses it), while the g - 1 edges inside a node run on B_intra. Every step
  waits for the slowest edge: T = steps max(alpha) + factor n / min(B_intra, g B_inter).
  With one NIC of B_inter per rank, NCCL's rings (one per channel, each through its own NIC) put n/g
  through each: the same bandwidth term, so `ring_time` is also NCCL's flat ring. For NCCL the world
  collective stays `two_level_time`: its tree and NVLS/CollNet algorithms cross the nodes with about
  the hierarchical scheme's n/g per NIC (its ring, picked by its tuner for some sizes, is `ring_time`).
"""

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
    if collective not in COLLECTIVES:
        raise CommsError(f"unknown collective {collective!r}: choose one of {', '.join(COLLECTIVES)}")


def check_fabric(fabric: str) -> None:
    if fabric not in FABRICS:
        raise CommsError(f"unknown fabric {fabric!r}: choose one of {', '.join(FABRICS)}")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise CommsError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def backend_of(topology) -> str:
    """The backend of a `TopologyConfig`: its `backend`, 'auto' being NCCL on cuda and Gloo on cpu
    (as `dlrm.distributed.topology.backend_for`, which imports torch)."""
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
    """(steps, factor) such that T = steps * alpha + factor * n / B; see the module docstring."""
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
    """Seconds for one collective among p ranks on one level, as `backend` runs it (module docstring):
    NCCL by the fabric's formula (`collective_time`); Gloo's allreduce and allgather as rings on any
    fabric, its reduce-scatter as an allreduce, its alltoall by the fabric's formula."""
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
    """Seconds for one collective of `nbytes` over nodes x ranks_per_node ranks by the two-level scheme
    (module docstring), each level's collective as `backend` runs it (`level_time`)."""
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
    """Seconds for one ring collective over all nodes x ranks_per_node ranks in rank order (module docstring):
    the ring's (steps, factor) for p = N g, each step at the largest alpha of the levels it crosses and
    the bandwidth term at min(B_intra (g > 1), g B_inter (N > 1)). Allreduce, reduce-scatter, allgather."""
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
    """Seconds for one collective over all nodes x ranks_per_node ranks, one process group, as `backend`
    runs it: NCCL by the two-level scheme (`two_level_time`); Gloo's alltoall likewise (direct sends,
    intra and inter concurrent), its allreduce and allgather as one flat ring (`ring_time`), its
    reduce-scatter as that ring's allreduce."""
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

    Inputs are per rank and per iteration, in bytes, summed over forward and backward:
    - alltoall_bytes_intra: bytes this rank sends by alltoall to other ranks of its node;
    - alltoall_bytes_inter: bytes this rank sends by alltoall to ranks on other nodes;
    - allreduce_bytes: size of the allreduced buffer (dense gradients: parameters x 4 for fp32);
    - ranks_per_node: needed when topology.ranks_per_node is None (pass LOCAL_WORLD_SIZE);
    - alltoall_count / allreduce_count: collectives issued per iteration (each pays its latency);
    - dense_allreduce: "flat" (DDP's one allreduce over all ranks: `world_time` on the topology's
      backend) or "hierarchical" (`two_level_time` on that backend), as trainer.dense_allreduce.
    Returns seconds: alltoall_intra, alltoall_inter, alltoall (= max, they run concurrently),
    allreduce, total (= alltoall + allreduce, no overlap with compute assumed).
    Bytes sent are turned into link time with the fabric's hops: a ring carries a byte (p/2) times
    on average (p = ranks at that level), fully connected and switch once. The alltoalls take each
    level's alltoall figures and the allreduce its allreduce figures (`Link.from_config`).
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
