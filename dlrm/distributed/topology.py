"""The process group and TorchRec's planner Topology, from the topology config and the launcher's world.

`validate_world` checks the launcher's world against the config before anything starts,
`init_distributed` creates the process group and `planner_topology` describes the hardware to the
planner.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torchrec.distributed.planner.types import (
    BasicCommsBandwidths,
    CollectiveType,
    HardwareConfig,
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)

from dlrm.common.errors import UserError
from dlrm.config import TopologyConfig
from dlrm.distributed.rendezvous import end_with_launcher, launcher_store
from dlrm.distributed.world import World

GB = 10**9


def backend_for(cfg: TopologyConfig) -> str:
    """'auto' means NCCL on CUDA and Gloo on CPU."""
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if cfg.device == "cuda" else "gloo"


class DeviceError(UserError, RuntimeError):
    """The topology's device is not there; the message says what to change."""

    same_on_all_ranks = True  # no GPU at all: every rank meets it alike


class NoGPUForRankError(DeviceError):
    """This rank's local index has no GPU (more ranks per node than GPUs)."""

    same_on_all_ranks = False  # only the ranks past the GPU count meet it


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for `device`'s queued work (CUDA), or does nothing (CPU).

    Call it only where a clock must include the device's work (a log window's end, a pause, a
    profiled step), never after every step: the host runs ahead of the GPU.
    """
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    return lambda: None


def device_for(cfg: TopologyConfig, world: World, tf32: bool = False) -> torch.device:
    """The compute device of this rank: cuda:<local rank> or cpu. The one place with CUDA calls.

    A ROCm build of torch answers to the same 'cuda' device and 'nccl' backend names.

    Args:
        cfg: the topology config (its device).
        world: this process's place in the job.
        tf32: allow TF32 in CUDA matmuls and cuDNN.

    Raises:
        DeviceError: the topology asks for cuda and torch sees no GPU (the message says why), or this
            rank's local index has no GPU (NoGPUForRankError).
    """
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"topology={cfg.name} wants device=cuda but torch sees no GPU here: {no_gpu_reason()}")
        if world.local_rank >= torch.cuda.device_count():
            raise NoGPUForRankError(
                f"local rank {world.local_rank} has no GPU: torch sees {torch.cuda.device_count()} on this node; "
                "start at most that many ranks per node (torchrun --nproc_per_node) or check CUDA_VISIBLE_DEVICES"
            )
        torch.cuda.set_device(world.local_rank)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


def no_gpu_reason() -> str:
    """Why torch sees no GPU, and the fix: a CPU-only build of torch, or CUDA's own reason (no driver,
    a driver too old for this build's CUDA, no device), as `torch.cuda.init` raises it."""
    if torch.version.cuda is None and torch.version.hip is None:
        build = f"this torch ({torch.__version__}) is a CPU-only build"
        return f"{build}: install a CUDA build (docs/gpu.md), or use topology=cpu"
    try:
        torch.cuda.init()
    except Exception as e:  # CUDA's reason, e.g. "The NVIDIA driver on your system is too old (found version 12040)"
        reason = str(e).strip().split(". ")[0].rstrip(".")
    else:
        reason = "CUDA initialised but reports no device"
    too_old = "too old" in reason
    fix = (
        f"this torch is built for CUDA {torch.version.cuda}: update the driver (CUDA 13 needs >= 580), "
        "or install a torch and fbgemm-gpu built for your driver's CUDA (the image: docker build "
        "--build-arg CUDA_VERSION=12.8; docs/gpu.md)"
        if too_old
        else "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES, or use topology=cpu"
    )
    return f"{reason}; {fix}"


class CollectiveFailure(UserError):
    """A collective of the training group timed out or lost a rank: the job cannot go on. Not a user
    error, but said in one line (`failed: ...`, exit 3) instead of a traceback per rank."""

    exit_code = 3
    prefix = "failed"


def _what_next() -> str:
    """How a failed job goes on: torchrun restarts it while --max-restarts allows (it then resumes
    with trainer.resume=auto), else the user runs it again."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    done = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if done < restarts:
        return (
            f"torchrun restarts the job (restart {done + 1} of --max-restarts={restarts}), from the last "
            "checkpoint if the command has trainer.resume=auto"
        )
    return "continue from the last checkpoint with trainer.resume=auto"


def collective_failure(e: BaseException, timeout_s: float) -> CollectiveFailure | None:
    """The one-line failure for Gloo's collective timeout or lost connection, else None (NCCL's
    watchdog ends the process itself after `timeout_s`; its log says so)."""
    text = str(e)
    again = _what_next()
    timed_out = r"Timed out waiting \d+ms for \w+ operation|Application timeout caused pair closure"
    if isinstance(e, RuntimeError) and re.search(timed_out, text):
        return CollectiveFailure(
            f"a collective waited {timeout_s:g} s (trainer.collective_timeout_s) for another rank: a rank "
            f"stalled or the network between nodes failed; {again} (raise trainer.collective_timeout_s if "
            "a rank pauses longer on purpose)"
        )
    if isinstance(e, RuntimeError) and re.search(r"Connection (closed|reset) by peer", text):
        return CollectiveFailure(
            f"lost the connection to another rank (it failed or was stopped, or the network dropped it; "
            f"see its own output); {again}"
        )
    return None


def init_distributed(
    cfg: TopologyConfig, world: World, device: torch.device | None = None, timeout_s: float | None = None
) -> dist.ProcessGroup:
    """The default process group: from the launcher's environment, or a 1-rank group in-process.

    Args:
        cfg: the topology config (backend).
        world: this process's place in the job.
        device: this rank's GPU, bound to the group at once, so a wrong device or broken link fails here.
        timeout_s: how long collectives wait for the other ranks (None: torch's default).

    Returns:
        The default process group.
    """
    if not dist.is_initialized():
        backend = backend_for(cfg)
        end_with_launcher()
        store = launcher_store(world, timeout_s) if "MASTER_ADDR" in os.environ else dist.HashStore()
        dist.init_process_group(
            backend=backend,
            store=store,
            rank=world.rank,
            world_size=world.world_size,
            timeout=None if timeout_s is None else timedelta(seconds=timeout_s),
            device_id=device if device is not None and device.type == "cuda" else None,
        )
    return cast(dist.ProcessGroup, dist.group.WORLD)  # set by init_process_group


@dataclass(frozen=True)
class ProcessGroups:
    """The job's process groups, in one place.

    world: all ranks. intra_node: the ranks of this rank's node. inter_node: the ranks with this
    rank's local index on every node.
    """

    world: dist.ProcessGroup
    intra_node: dist.ProcessGroup
    inter_node: dist.ProcessGroup


def build_process_groups(device: torch.device, nodes: int, ranks_per_node: int) -> ProcessGroups:
    """Node x local-rank groups over the default group: rank = node * ranks_per_node + local rank.

    A collective call: every rank must make it. Built from a 2-D (node, local) device mesh.

    Returns:
        The `ProcessGroups`: world, this rank's node, and the ranks of its local index across nodes.
    """
    mesh = init_device_mesh(device.type, (nodes, ranks_per_node), mesh_dim_names=("node", "local"))
    return ProcessGroups(
        world=cast(dist.ProcessGroup, dist.group.WORLD),
        intra_node=mesh.get_group("local"),
        inter_node=mesh.get_group("node"),
    )


PLANNER_COLLECTIVES = {  # TorchRec's collective types, by the names of TopologyConfig's LinkConfig.collectives
    CollectiveType.ALL_TO_ALL: "alltoall",
    CollectiveType.REDUCE_SCATTER: "reduce_scatter",
    CollectiveType.ALL_GATHER: "allgather",
    CollectiveType.ALL_REDUCE: "allreduce",
}


# TorchRec 1.8's estimator (planner/estimator/estimator.py): tests/plan/test_planner.py notices a change.
# The derivation: docs/design/library-workarounds.md.
def bytes_counted(collective_type: CollectiveType, world_size: int, local_world_size: int) -> float:
    """How many times the bytes a rank's collective moves TorchRec's perf estimator counts.

    ALL_TO_ALL: W / (W - 1) (it counts the rank's own share too). ALL_REDUCE: (2N - 1) / N with N =
    min(nodes, 2), against a ring's 2 (W - 1) / W. Reduce-scatter and allgather: 1.

    Args:
        collective_type: TorchRec's collective.
        world_size, local_world_size: the launch's shape.

    Returns:
        The estimator's bytes over the bytes moved.
    """
    w = world_size
    if w <= 1:
        return 1.0
    if collective_type == CollectiveType.ALL_TO_ALL:
        return w / (w - 1)
    if collective_type == CollectiveType.ALL_REDUCE:
        n = min(w / local_world_size, 2)
        return ((2 * n - 1) / n) / (2 * (w - 1) / w)
    return 1.0


# Corrects TorchRec's BasicCommsBandwidths allreduce pricing:
# tests/plan/test_planner.py notices a TorchRec that fixes its own.
class LinkBandwidths(BasicCommsBandwidths):
    """TorchRec's bandwidth per collective (bytes/ms), the allreduce priced on the links it crosses.

    An allreduce on one node runs at the intra-node link, across nodes at the slower of it and the node's
    NICs; a collective with its own fitted figures (`LinkConfig.collectives`) uses them. Each bandwidth is
    multiplied by `bytes_counted`, so the estimator's time is the bytes moved over the link's bandwidth.
    """

    def __init__(
        self, inter_host_bw: float, intra_host_bw: float, own: dict[CollectiveType, tuple[float, float]] | None = None
    ) -> None:
        super().__init__(inter_host_bw=inter_host_bw, intra_host_bw=intra_host_bw)
        self.own = dict(own or {})

    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float:
        inter, intra = self.own.get(collective_type, (self.inter_host_bw, self.intra_host_bw))
        if world_size <= local_world_size:
            bw = intra
        elif collective_type != CollectiveType.ALL_REDUCE:
            bw = inter
        else:
            bw = min(intra, inter * local_world_size)
        return bw * bytes_counted(collective_type, world_size, local_world_size)

    def __hash__(self) -> int:
        return hash((super().__hash__(), tuple(sorted((k.value, v) for k, v in self.own.items()))))

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and getattr(other, "own", None) == self.own


def planner_topology(cfg: TopologyConfig, world_size: int, local_world_size: int) -> Topology:
    """TorchRec's Topology: sizes from the launcher, memory and bandwidths from the config.

    Args:
        cfg: the topology config.
        world_size, local_world_size: the launcher's sizes.

    Returns:
        TorchRec's Topology (bandwidth in bytes per millisecond, capacity in bytes).
    """
    to_bytes_per_ms = GB / 1000.0
    intra = cfg.intra_node.bandwidth_GBps * to_bytes_per_ms
    inter = cfg.inter_node.bandwidth_GBps * to_bytes_per_ms
    own = {}
    for kind, name in PLANNER_COLLECTIVES.items():
        links = (cfg.inter_node, cfg.intra_node)
        if any(name in link.collectives for link in links):
            figures = [link.collectives[name] if name in link.collectives else link for link in links]
            own[kind] = (figures[0].bandwidth_GBps * to_bytes_per_ms, figures[1].bandwidth_GBps * to_bytes_per_ms)
    return TopologyFactory.create_topology(  # the supported constructor (a direct Topology warns)
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=int(cfg.hbm_GB * GB) if cfg.device == "cuda" else None,
            ddr_cap_bytes=int(cfg.ddr_GB * GB),
        ),
        hardware_config=HardwareConfig(intra_host_bw=intra, inter_host_bw=inter),
        kernel_config=KernelConfig(
            compute_device=cfg.device,
            generalized_comms_bandwidths=LinkBandwidths(inter_host_bw=inter, intra_host_bw=intra, own=own),
        ),
    )
