"""DDP communication hooks for the dense gradients: hierarchical allreduce over a node x local mesh,
and compression of the allreduce to bf16 or fp16 (trainer.dense_allreduce_precision)."""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    bf16_compress_hook,
    bf16_compress_wrapper,
    fp16_compress_hook,
    fp16_compress_wrapper,
)
from torch.nn.parallel import DistributedDataParallel

from dlrm.distributed.topology import ProcessGroups

# trainer.dense_allreduce_precision -> torch's hook for the flat allreduce, and its wrapper of any hook.
COMPRESS_HOOKS = {"bf16": bf16_compress_hook, "fp16": fp16_compress_hook}
COMPRESS_WRAPPERS = {"bf16": bf16_compress_wrapper, "fp16": fp16_compress_wrapper}


def hierarchical_allreduce_(tensor: torch.Tensor, groups: ProcessGroups) -> torch.Tensor:
    """Average `tensor` over all ranks in place by the two-level scheme.

    1. reduce-scatter inside the node: each of the g local ranks gets the node's sum of 1/g of it;
    2. allreduce of that 1/g across nodes: n/g bytes per rank cross the inter-node network;
    3. allgather inside the node to rebuild the whole tensor.

    Args:
        tensor: any shape; padded internally to a multiple of g elements.
        groups: the job's intra- and inter-node groups.

    Returns:
        `tensor`, averaged.
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


# Gloo's bf16 reduction is checked by tests/distributed/test_precision_training.py.
def _registrable(hook, group: dist.ProcessGroup):
    """`hook` as DDP accepts it on `group`'s backend.

    DDP refuses torch's bf16 hooks by name unless NCCL supports bf16; on Gloo, which reduces bf16 too, the
    same hook is registered under another name. On NCCL torch's own check runs.
    """
    if dist.get_backend(group) != "gloo":
        return hook

    def gloo_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return hook(state, bucket)

    return gloo_hook


def _ddp_modules(model: torch.nn.Module) -> list[DistributedDataParallel]:
    """The DDP modules DMP built inside `model` (the dense MLPs, data-parallel tables)."""
    return [m for m in model.modules() if isinstance(m, DistributedDataParallel)]


def use_hierarchical_allreduce(model: torch.nn.Module, groups: ProcessGroups, precision: str = "fp32") -> int:
    """Register the hierarchical hook on every DDP module inside `model`, before the first forward.

    The three steps run synchronously inside the hook (exact; on GPUs not overlapped with the backward).

    Args:
        model: the DMP-wrapped model.
        groups: the job's process groups.
        precision: 'fp32', or 'bf16'/'fp16' to send every step in that precision and cast back.

    Returns:
        How many DDP modules got the hook.
    """
    hook = _hierarchical_hook
    if precision != "fp32":
        hook = _registrable(COMPRESS_WRAPPERS[precision](_hierarchical_hook), groups.world)
    ddps = _ddp_modules(model)
    for ddp in ddps:
        ddp.register_comm_hook(groups, hook)
    return len(ddps)


def use_compressed_allreduce(model: torch.nn.Module, precision: str, group: dist.ProcessGroup) -> int:
    """Register torch's bf16/fp16 compression hook on every DDP module inside `model`, before the first forward.

    Each bucket is cast to `precision`, divided by the world size, allreduced over `group` in that precision
    and cast back.

    Returns:
        How many DDP modules got the hook.
    """
    hook = _registrable(COMPRESS_HOOKS[precision], group)
    ddps = _ddp_modules(model)
    for ddp in ddps:
        ddp.register_comm_hook(group, hook)
    return len(ddps)
