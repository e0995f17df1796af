"""DDP communication hooks for the dense gradients: hierarchical allreduce over a node x local mesh."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlrm.core.topology import ProcessGroups


def hierarchical_allreduce_(tensor: torch.Tensor, groups: ProcessGroups) -> torch.Tensor:
    """Average `tensor` over all ranks in place, in three steps (the Zion two-level scheme):

    1. reduce-scatter inside the node: each of the g local ranks gets the node's sum of 1/g of it;
    2. allreduce across nodes of that 1/g: only n/g bytes per rank cross the inter-node network;
    3. allgather inside the node to rebuild the whole tensor.
    The tensor is padded to a multiple of g. Returns `tensor`.
    """
    g = dist.get_world_size(groups.intra_node)
    world = dist.get_world_size(groups.world)
    n = tensor.numel()
    flat = torch.zeros(n + (-n) % g, dtype=tensor.dtype, device=tensor.device)
    flat[:n] = tensor.reshape(-1)
    flat.div_(world)
    shard = torch.empty(flat.numel() // g, dtype=tensor.dtype, device=tensor.device)
    dist.reduce_scatter_tensor(shard, flat, group=groups.intra_node)
    dist.all_reduce(shard, group=groups.inter_node)
    dist.all_gather_into_tensor(flat, shard, group=groups.intra_node)
    tensor.view(-1).copy_(flat[:n])
    return tensor


# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.
def _hierarchical_hook(groups: ProcessGroups, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    future = torch.futures.Future()
    future.set_result(hierarchical_allreduce_(bucket.buffer(), groups))
    return future


def use_hierarchical_allreduce(model: torch.nn.Module, groups: ProcessGroups) -> int:
    """Register the hierarchical hook on every DDP module inside `model` (dense MLPs, data-parallel
    tables); call before the first forward. Returns how many DDP modules got it.

    The three steps run synchronously inside the hook: exact and simple; on GPUs they do not yet
    overlap with the rest of the backward pass.
    """
    ddps = [m for m in model.modules() if isinstance(m, DistributedDataParallel)]
    for ddp in ddps:
        ddp.register_comm_hook(groups, _hierarchical_hook)
    return len(ddps)
