"""The non-finite checks of saving and loading: which tensors hold NaN or inf, on any rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from dlrm.models.dlrm import local_pieces

CHUNK = 1 << 24  # elements checked at once: a non-contiguous block's copy stays at 64 MB however large the shard


def all_finite(t: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """Whether every element of `t` is finite, as a 0-d bool tensor on t's device (no host wait).

    Checks `chunk` elements at a time: blocks of the flat tensor, or of whole rows (dim 0) when `t`
    is not contiguous (a row wider than `chunk` is one block). A block is finite when its min and max
    are (`torch.aminmax` propagates NaN): one pass without temporaries of the block's size.
    """
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    if t.numel() == 0:
        return ok
    if t.is_contiguous():
        blocks = t.view(-1).split(chunk)
    else:
        blocks = t.split(max(1, chunk // (t.numel() // t.shape[0])))
    for block in blocks:
        ok &= torch.isfinite(torch.stack(torch.aminmax(block))).all()
    return ok


def nonfinite_tensors(state: dict, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in `state` (nested dicts) with a NaN or inf in the
    pieces this rank holds (every local shard of a ShardedTensor), checked in chunks (`all_finite`)
    and read back in one wait per device."""
    flags = _finite_flags(state, prefix)
    ok: dict[str, bool] = {}
    for device in {flag.device for _, flag in flags}:
        group = [(name, flag) for name, flag in flags if flag.device == device]
        ok.update(zip((name for name, _ in group), torch.stack([flag for _, flag in group]).tolist(), strict=True))
    return [name for name, _ in flags if not ok[name]]


def _finite_flags(state: dict, prefix: str) -> list[tuple[str, torch.Tensor]]:
    """(dotted name, 0-d bool: all finite) of each floating-point tensor in `state`, in order."""
    flags = []
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flags += _finite_flags(value, name + ".")
            continue
        pieces = [all_finite(t) for t, _, _ in local_pieces(value) if t.dtype.is_floating_point]
        if pieces:
            flags.append((name, torch.stack(pieces).all()))
    return flags


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
