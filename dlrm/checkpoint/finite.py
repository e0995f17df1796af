"""The non-finite checks of saving and loading: which tensors hold NaN or inf, on any rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dlrm.models.dlrm import local_pieces


def nonfinite_tensors(state: dict, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in `state` (nested dicts) with a NaN or inf in the
    pieces this rank holds (every local shard of a ShardedTensor)."""
    bad = []
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            bad += nonfinite_tensors(value, name + ".")
        elif not all(bool(torch.isfinite(t).all()) for t, _, _ in local_pieces(value) if t.dtype.is_floating_point):
            bad.append(name)
    return bad


def everyones(names: list[str], pg: dist.ProcessGroup | None) -> list[str]:
    """The union over the ranks of `names` (one object collective; `names` alone without a group)."""
    if pg is None:
        return sorted(names)
    every: list[list[str]] = [[] for _ in range(dist.get_world_size(pg))]
    dist.all_gather_object(every, names, group=pg)
    return sorted({n for part in every for n in part})


def listed(names: list[str], most: int = 3) -> str:
    """The first `most` of `names`, and how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
