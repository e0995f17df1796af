"""Rank functions of the precision tests (importable, so spawn can pickle them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrm.distributed.dense_sync import use_compressed_allreduce, use_hierarchical_allreduce
from dlrm.distributed.topology import build_process_groups
from dlrm.trainer.metrics import score_on_rank0
from tests.helpers.harness import default_group

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _net(rank: int) -> torch.nn.Module:
    """Two layers whose gradients (with the rank's input) are not representable in bf16/fp16."""
    torch.manual_seed(0)  # the same weights on every rank, as DDP requires
    return torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.Tanh(), torch.nn.Linear(53, 3))


def _input(rank: int) -> torch.Tensor:
    return torch.randn(16, 37, generator=torch.Generator().manual_seed(100 + rank))


def compressed_gradients(precision: str, nodes: int, ranks_per_node: int) -> dict:
    """DDP with our compression hook (flat for nodes == 1, hierarchical otherwise) on a small net.

    Returns the gradients the optimizer would see, every rank's local (uncommunicated) fp32
    gradients, and what the flat hook must give: each rank's gradient rounded to `precision`,
    divided by the world size there, summed there (gloo, 2 ranks: one rounding) and cast back.
    """
    default_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DistributedDataParallel(_net(rank), bucket_cap_mb=1)
    if nodes == 1:
        hooked = use_compressed_allreduce(ddp, precision, dist.group.WORLD)
    else:
        hooked = use_hierarchical_allreduce(
            ddp, build_process_groups(torch.device("cpu"), nodes, ranks_per_node), precision
        )
    with ddp.no_sync():  # the local gradients, no communication
        ddp(_input(rank)).square().sum().backward()
    local = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone()
    ddp.zero_grad()
    ddp(_input(rank)).square().sum().backward()
    seen = torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone()
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local)
    dtype = DTYPES[precision]
    summed = torch.zeros_like(local, dtype=dtype)
    for g in every:
        summed = summed + g.to(dtype).div(world)  # each add rounds to `dtype`
    return {"hooked": hooked, "seen": seen, "locals": every, "flat_expected": summed.float()}


def score_slices(slices: list[torch.Tensor]) -> dict:
    """`score_on_rank0` of this rank's [2, N] slice of `slices`."""
    default_group()
    result = score_on_rank0(slices[dist.get_rank()], dist.group.WORLD)
    return result
