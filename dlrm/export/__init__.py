"""Export a trained model: `python -m dlrm.export CHECKPOINT_DIR OUT [--format file|bundle] [--int8]`.

file (`dlrm.export.file`): one weights-only torch file of the unsharded weights and configs, scored by
`python -m dlrm.predict`. bundle (`dlrm.export.bundle`): a directory a server loads without this
package: the model compiled with AOTInductor (`model.pt2`) and its feature spec (`spec.json`,
`dlrm.export.spec`); see docs/serving.md.
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
    """`python -m dlrm.export` (see `dlrm.export.cli`)."""
    from dlrm.export.cli import main as cli_main

    return cli_main(argv)
