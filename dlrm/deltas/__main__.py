"""`python -m dlrm.deltas list DIR` (the deltas a directory holds) and `python -m dlrm.deltas apply
EXPORT DIR --out OUT.pt [--to STEP]` (an export with a chain of deltas applied: the export at STEP)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dlrm.common.errors import ArgumentParser, UserError


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.deltas", description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="the deltas of a directory")
    ls.add_argument("dir", type=Path)
    ap_apply = sub.add_parser("apply", help="apply a chain of deltas to an export")
    ap_apply.add_argument("export", type=Path, help="an export (python -m dlrm.export) at a delta's base step")
    ap_apply.add_argument("dir", type=Path, help="the deltas directory")
    ap_apply.add_argument("--out", type=Path, required=True, help="the export to write")
    ap_apply.add_argument("--to", type=int, default=None, help="the step to reach (default: the last delta's)")
    try:
        a = ap.parse_args(argv)
        if a.command == "list":
            from dlrm.deltas.publish import read_manifest

            entries = read_manifest(a.dir)
            if not entries:
                raise UserError(f"{a.dir} holds no deltas (no manifest.json); set deltas.every_steps in training")
            print(f"{'step':>8} {'base':>8} {'bytes':>12}  rows per table")
            for e in entries:
                rows = ", ".join(f"{k} {v}" for k, v in e["rows"].items())
                print(f"{e['step']:>8} {e['base_step']:>8} {e['bytes']:>12,}  {rows}")
            return 0
        import torch

        from dlrm.common.io import atomic_path
        from dlrm.deltas.apply import apply_chain

        payload = apply_chain(a.export, a.dir, a.to)
        with atomic_path(a.out) as tmp:
            torch.save(payload, tmp)
        print(f"wrote {a.out}: the export at step {payload['step']}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
