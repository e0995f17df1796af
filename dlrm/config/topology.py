"""The topology section: nodes, ranks, device, the links between ranks and their capacities."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dlrm.config.checks import _fail, _require_positive
from dlrm.config.choices import Backend, Device, Fabric

COLLECTIVES = ("allreduce", "alltoall", "reduce_scatter", "allgather")  # as dlrm.comms.costmodel
UPLINK_GBIT_ENV = "DLRM_UPLINK_GBIT"  # dlrm.cluster's shaped uplink rate (Gbit/s), set for the ranks it starts


@dataclass
class CollectiveLinkConfig:
    """One collective's own latency and bandwidth on a level, where it differs from the level's."""

    bandwidth_GBps: float = 2.0
    """Unidirectional bandwidth per rank in GB/s (1e9 bytes/s) that this collective reaches."""
    latency_us: float = 50.0
    """Per-message latency (alpha) of this collective in microseconds."""


@dataclass
class LinkConfig:
    """One level of the interconnect, as seen by one rank. The defaults are placeholders of the right
    order for Gloo over loopback TCP: measure and fit yours with `python -m dlrm.comms.fit`."""

    fabric: Fabric = Fabric.switch
    """How ranks at this level are wired (ring, fully_connected, switch): the cost model's formulas
    (dlrm.comms.costmodel)."""
    bandwidth_GBps: float = 2.0
    """Unidirectional bandwidth per rank in GB/s (1e9 bytes/s), all links together."""
    latency_us: float = 50.0
    """Per-message latency (the alpha of an alpha-beta model) in microseconds."""
    collectives: dict[str, CollectiveLinkConfig] = field(default_factory=dict)
    """Per collective (allreduce, alltoall, reduce_scatter, allgather): its own latency and bandwidth,
    used by the cost model for it instead of the two above ({}: the two above for every collective).
    `python -m dlrm.comms.fit` writes them when the collectives' fits differ materially."""
    placeholder: bool = True
    """True (as the defaults above are): the figures are placeholders, an order of magnitude neither
    measured nor from a datasheet, so a run does not compare its measured communication with a model
    built on them (comm_vs_model says why). A topology file with measured or published figures says
    `placeholder: false`; `python -m dlrm.comms.fit` writes that."""

    def rate_overrides(self, key: str, bandwidth_GBps: float) -> list[str]:
        """Hydra overrides that set this link (at config key `key`) to `bandwidth_GBps`, each collective's
        own bandwidth scaled by the same factor: a fit on an emulated link at one rate (its collectives'
        shares of it: Gloo's 2-rank alltoall reached half of it) carried to another rate."""
        scale = bandwidth_GBps / self.bandwidth_GBps
        return [f"{key}.bandwidth_GBps={bandwidth_GBps!r}"] + [
            f"{key}.collectives.{name}.bandwidth_GBps={link.bandwidth_GBps * scale!r}"
            for name, link in sorted(self.collectives.items())
        ]

    def check(self, key: str) -> None:
        _check_link(key, self.bandwidth_GBps, self.latency_us)
        for name, link in self.collectives.items():
            if name not in COLLECTIVES:
                _fail(f"{key}.collectives.{name}", name, f"name one of {', '.join(COLLECTIVES)}")
            _check_link(f"{key}.collectives.{name}", link.bandwidth_GBps, link.latency_us)


def _check_link(key: str, bandwidth_GBps: float, latency_us: float) -> None:
    _require_positive(f"{key}.bandwidth_GBps", bandwidth_GBps)
    if not latency_us >= 0 or math.isinf(latency_us):
        _fail(f"{key}.latency_us", latency_us, "use a finite latency >= 0")


@dataclass
class TopologyConfig:
    """Nodes x ranks per node and the fabric between them; drives process groups and the planner.
    The defaults describe one CPU machine (topology=cpu)."""

    name: str = "cpu"
    """The topology's name, shown in the console, the plan and messages."""
    nodes: int = 1
    """Nodes (hosts); nodes x ranks_per_node must equal the launcher's WORLD_SIZE."""
    ranks_per_node: int | None = None
    """None takes the launcher's LOCAL_WORLD_SIZE; a number is checked against it."""
    device: Device = Device.cpu
    """The training device: cpu or cuda (one GPU per rank)."""
    backend: Backend = Backend.auto
    """The process groups' backend: auto (NCCL on cuda, Gloo on cpu), gloo or nccl (cuda only)."""
    intra_node: LinkConfig = field(
        default_factory=lambda: LinkConfig(bandwidth_GBps=1.284, latency_us=162.23, placeholder=False)
    )
    """The links between the ranks of one node. The defaults: Gloo over one machine's loopback, fitted by
    `python -m dlrm.comms.fit` on this project's 2-core CPU machines (conf/topology/cpu.yaml says when)."""
    inter_node: LinkConfig = field(default_factory=LinkConfig)
    """The links between nodes, as seen by one rank."""
    hbm_GB: float = 0.0
    """Device memory per rank available to the model, in GB (required with device=cuda)."""
    ddr_GB: float = 8.0
    """Host memory per rank available to the model, in GB."""
    dense_tflops: float | None = None
    """Peak dense matmul TFLOP/s per rank, for the step-time projection of `python -m dlrm.plan --scale`
    (None: unknown; pass --measured instead)."""
    mem_bw_GBps: float | None = None
    """Peak memory bandwidth per rank in GB/s, for the step-time projection of `python -m dlrm.plan
    --scale` (None: unknown; pass --measured instead)."""

    def check(self, key: str = "topology") -> None:
        _require_positive(f"{key}.nodes", self.nodes)
        if self.ranks_per_node is not None:
            _require_positive(f"{key}.ranks_per_node", self.ranks_per_node)
        if self.device == Device.cpu and self.backend == Backend.nccl:
            _fail(f"{key}.backend", self.backend, "NCCL needs topology.device=cuda; use gloo or auto on CPU")
        self.intra_node.check(f"{key}.intra_node")
        self.inter_node.check(f"{key}.inter_node")
        if self.device == Device.cuda:
            _require_positive(f"{key}.hbm_GB", self.hbm_GB)
        _require_positive(f"{key}.ddr_GB", self.ddr_GB)
        for name in ("dense_tflops", "mem_bw_GBps"):
            if getattr(self, name) is not None:
                _require_positive(f"{key}.{name}", getattr(self, name))
