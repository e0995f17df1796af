"""Export a trained model: `python -m dlrm.export CHECKPOINT_DIR OUT [--format file|bundle] [--int8]`.

file: one weights-only torch file of the unsharded weights and configs, which the scorer reads.
bundle: a directory a server loads without this package, the model compiled with AOTInductor
(`model.pt2`) and its feature spec (`spec.json`).
"""

from dlrm.export.file import (
    FORMAT,
    READS,
    VERSION,
    ExportedData,
    content_sha256,
    export,
    load_exported,
    model_config_of,
    read_exported,
    table_metadata,
)

__all__ = [
    "FORMAT",
    "READS",
    "VERSION",
    "ExportedData",
    "content_sha256",
    "export",
    "load_exported",
    "main",
    "model_config_of",
    "read_exported",
    "table_metadata",
]


def main(argv: list[str] | None = None) -> int:
    """Run the export command on `argv`; returns its exit status."""
    from dlrm.export.cli import main as cli_main

    return cli_main(argv)
