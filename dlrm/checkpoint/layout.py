"""The layout of `checkpoint.dir`, and the error every checkpoint check raises.

step_00000040/            a complete checkpoint: DCP shards (*.distcp) + `.metadata` + manifest.json
.step_00000050.partial/   a save in progress (or interrupted): never read, removed by the next save
"""

from __future__ import annotations

from pathlib import Path

import torch

from dlrm.common.errors import UserError

MANIFEST = "manifest.json"
METADATA = ".metadata"
_PREFIX = "step_"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message says why and what to do."""

    same_on_all_ranks = True  # every rank checks the same checkpoint files and manifest


def checkpoint_dirname(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root` (a manifest is written last), oldest first."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.name.startswith(_PREFIX) and p.name[len(_PREFIX) :].isdigit() and (p / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def another_checkpoint(path: Path) -> str:
    """The fix for a damaged checkpoint: the newest other complete checkpoint beside it, if any."""
    others = [p for p in complete_checkpoints(path.parent) if p.name != path.name]
    if others:
        return f"use another checkpoint, e.g. trainer.resume={others[-1]}"
    return "use another checkpoint, or train again without trainer.resume"


def step_tensor(step: int) -> torch.Tensor:
    return torch.tensor([step], dtype=torch.int64)
