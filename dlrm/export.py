"""Export a checkpoint as one unsharded file: `python -m dlrm.export CHECKPOINT_DIR OUT.pt`.

Runs in one process, no process group: the model described by the checkpoint's manifest is built
whole on the CPU, DCP fills it from the shards, and its state dict is written with torch.save
(plain tensors: `torch.load(OUT, weights_only=True)` reads it; `load_exported` rebuilds the model).
The checkpoint is verified first (see dlrm.core.checkpoint; `--no-verify` skips the data files' sha256).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import cast

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dlrm.config import ModelConfig
from dlrm.core.checkpoint import CheckpointError, load_checkpoint, read_manifest, step_tensor
from dlrm.core.model import build_model
from dlrm.errors import UserError
from dlrm.io import atomic_path


def model_config_of(checkpoint: Path) -> ModelConfig:
    """The model config a checkpoint was written for (from its manifest)."""
    saved = read_manifest(checkpoint).get("model")
    try:
        return cast(ModelConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), saved)))
    except (OmegaConfBaseException, ValueError) as e:
        raise CheckpointError(
            f"{checkpoint / 'manifest.json'}: its model is not a valid model config ({e}); "
            "export a checkpoint written by this trainer"
        ) from None


def export(checkpoint: Path, out: Path, verify: bool = True) -> dict:
    """Write the checkpoint's model, unsharded, to `out` (atomically); returns its state dict."""
    if not out.parent.is_dir() or out.is_dir():
        raise UserError(
            f"cannot write {out}: {'it is a directory' if out.is_dir() else 'its directory does not exist'}; "
            "give a file path in an existing directory"
        )
    model = build_model(model_config_of(checkpoint), torch.device("cpu"))
    state = {"model": model.state_dict(), "progress": {"step": step_tensor(-1)}}
    load_checkpoint(checkpoint, state, verify)
    try:
        with atomic_path(out) as tmp:
            torch.save(state["model"], tmp)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
        raise UserError(f"cannot write {out}: {e}; free space or choose another path") from None
    return state["model"]


def load_exported(checkpoint: Path, exported: Path) -> torch.nn.Module:
    """The unsharded model (DLRMTrain) from an exported file, for evaluation or serving."""
    model = build_model(model_config_of(checkpoint), torch.device("cpu"))
    model.load_state_dict(torch.load(exported, weights_only=True))
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlrm.export", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (checkpoints/step_NNNNNNNN)")
    parser.add_argument("out", type=Path, help="the file to write, e.g. model.pt")
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the sha256 of the data files (sizes are still checked)"
    )
    args = parser.parse_args(argv)
    try:
        state = export(args.checkpoint, args.out, verify=not args.no_verify)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = sum(t.numel() for t in state.values())
    print(f"exported {len(state)} tensors ({params:,} values) from {args.checkpoint} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
