"""Distributed checkpoints with torch.distributed.checkpoint (DCP): atomic, kept K, resumable, verified.

- `layout`: the step_* directories of `checkpoint.dir`, and `CheckpointError`;
- `manifest`: manifest.json (canonical JSON with its own sha256, every file's size and sha256) and
  the model signature a checkpoint must match;
- `safe_load`: verifying an untrusted checkpoint before DCP reads it (allowlisted unpickling of
  `.metadata`), then loading it, resharded;
- `finite`: the NaN/inf checks of saving and loading;
- `checkpointer`: the `Checkpointer` that every rank calls to save and load.
"""

from dlrm.checkpoint.checkpointer import Checkpointer, NonFiniteCheckpointError
from dlrm.checkpoint.finite import nonfinite_tensors
from dlrm.checkpoint.layout import (
    MANIFEST,
    METADATA,
    CheckpointError,
    checkpoint_dirname,
    complete_checkpoints,
    latest_checkpoint,
    step_tensor,
)
from dlrm.checkpoint.manifest import (
    MANIFEST_LIMIT,
    data_signature,
    file_digest,
    model_signature,
    read_manifest,
    signature_differences,
    write_manifest,
)
from dlrm.checkpoint.safe_load import SafeFileSystemReader, load_checkpoint, open_checkpoint

__all__ = [
    "MANIFEST",
    "MANIFEST_LIMIT",
    "METADATA",
    "CheckpointError",
    "Checkpointer",
    "NonFiniteCheckpointError",
    "SafeFileSystemReader",
    "checkpoint_dirname",
    "complete_checkpoints",
    "data_signature",
    "file_digest",
    "latest_checkpoint",
    "load_checkpoint",
    "model_signature",
    "nonfinite_tensors",
    "open_checkpoint",
    "read_manifest",
    "signature_differences",
    "step_tensor",
    "write_manifest",
]
