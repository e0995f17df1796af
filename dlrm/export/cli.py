"""Export a checkpoint's model: `python -m dlrm.export CHECKPOINT_DIR OUT [--format file|bundle] [--int8]`.

--format file (the default): OUT is one weights-only torch file the scorer reads. --format bundle:
OUT is a new directory a server loads without this package (an AOTInductor model package and its
feature spec); --int8 stores its tables row-wise int8. Runs in one process, no process group; the
checkpoint is verified first (`--no-verify` skips the data files' sha256).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.export.file import export


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m dlrm.export", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory (checkpoints/step_NNNNNNNN)")
    parser.add_argument("out", type=Path, help="the file (--format file, e.g. model.pt) or new directory (bundle)")
    parser.add_argument(
        "--format",
        choices=("file", "bundle"),
        default="file",
        help="file: weights and configs for dlrm.predict; bundle: a compiled program and its feature spec",
    )
    parser.add_argument("--int8", action="store_true", help="bundle: store the tables row-wise int8")
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the sha256 of the data files (sizes are still checked)"
    )
    try:
        args = parser.parse_args(argv)
        if args.int8 and args.format != "bundle":
            raise UserError("--int8 is an option of --format bundle; add --format bundle or drop --int8")
        if args.format == "bundle":
            from dlrm.export.bundle import bundle  # torch._inductor: imported only to write a bundle

            spec = bundle(args.checkpoint, args.out, int8=args.int8, verify=not args.no_verify)
            size = sum(p.stat().st_size for p in args.out.iterdir())
            tables = "int8" if spec["model"]["int8"] else "fp32"
            print(f"bundled {args.checkpoint} ({tables} tables) to {args.out} ({size / 2**20:.1f} MiB)")
            return 0
        state = export(args.checkpoint, args.out, verify=not args.no_verify)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    params = sum(t.numel() for t in state.values())
    print(f"exported {len(state)} tensors ({params:,} values) from {args.checkpoint} to {args.out}")
    return 0
