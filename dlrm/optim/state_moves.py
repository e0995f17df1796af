"""Embedding optimizer state across sharding plans: a table that moves between fbgemm's fused kernels
and `data_parallel` at a resume keeps its optimizer state.

The two keep the same numbers under other names and shapes (per table parameter `w`):
- fused (table-, row-, column-wise...): {"<table>.momentum1": ShardedTensor}, [rows] for row-wise
  Adagrad, [rows, dim] for Adagrad;
- data_parallel (torch / TorchRec optimizer): {"step": scalar, "sum": [rows, 1] or [rows, dim]}.
DCP reshards a state between plans of one kind; `fit_to_checkpoint` renames and reshapes across the
two kinds, so that DCP loads the saved numbers into this run's tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

PREFIX = "optim.state."
FUSED_SUFFIX = ".momentum1"
REPLICATED = {"step", "sum"}


def _view(t: torch.Tensor, size: torch.Size) -> torch.Tensor | None:
    return t.view(size) if t.numel() == size.numel() else None


def fit_to_checkpoint(
    ours: dict[str, dict[str, torch.Tensor]], saved: dict[str, torch.Size], step: torch.Tensor
) -> tuple[dict, Callable[[], None], list[str]]:
    """This run's optimizer state keyed and shaped as the checkpoint saved it.

    A data-parallel `sum` loads the saved fused state through a view of itself; a fused ShardedTensor loads
    a saved `sum` through a full temporary that `finish` copies into its local shards; a data-parallel
    `step` becomes the resumed step.

    Args:
        ours: {param: {name: tensor}}, this run's optimizer state.
        saved: {DCP key "optim.state.<param>.<name>": global size}, from the checkpoint's metadata.
        step: the step tensor loaded with the rest.

    Returns:
        (the state to load into, `finish` to call after the load, the params whose saved state fits
        neither layout).
    """
    fitted: dict[str, dict[str, torch.Tensor]] = {}
    copies: list[tuple[torch.Tensor, ShardedTensor]] = []
    steps: list[torch.Tensor] = []
    misfits: list[str] = []
    for param, entries in ours.items():
        head = f"{PREFIX}{param}."
        theirs = {k[len(head) :]: size for k, size in saved.items() if k.startswith(head)}
        if not theirs or set(theirs) == set(entries):  # the same kind (or absent: DCP names it)
            fitted[param] = entries
            continue
        fused_saved = [n for n in theirs if n.endswith(FUSED_SUFFIX)]
        fused_ours = [n for n in entries if n.endswith(FUSED_SUFFIX)]
        if len(fused_saved) == 1 and set(entries) == REPLICATED:  # fused -> data_parallel
            view = _view(entries["sum"], theirs[fused_saved[0]])
            if view is not None:
                fitted[param] = {fused_saved[0]: view}
                steps.append(entries["step"])
                continue
        elif len(fused_ours) == 1 and set(theirs) == REPLICATED:  # data_parallel -> fused
            target = entries[fused_ours[0]]
            if isinstance(target, ShardedTensor) and target.size().numel() == theirs["sum"].numel():
                whole = torch.zeros(theirs["sum"])  # fp32, as both optimizers keep it
                fitted[param] = {"sum": whole}
                copies.append((whole, target))
                continue
        misfits.append(param)

    def finish() -> None:
        for whole, target in copies:
            full = whole.view(target.size())
            for shard in target.local_shards():
                md = shard.metadata
                block = full[tuple(slice(o, o + n) for o, n in zip(md.shard_offsets, md.shard_sizes, strict=True))]
                shard.tensor.copy_(block)
        for s in steps:
            s.fill_(float(step.item()))

    return fitted, finish, misfits
