"""Check a preprocessed Criteo directory before a long run: `python -m dlrm.data.criteo.check DIR [--no-checksums]`.

Runs the trainer's start-up verification on every day of DIR's manifest.json:
each .npy header, row counts, labels in {0, 1}, ids below their table's rows (the manifest's table
sizes, or `--table-sizes` to check against a model's tables), finite dense values and each file's
sha256. Prints one line per day, exit 0; the first problem is one `error:` line, exit 2.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.data.criteo.format import KINDS, NUM_SPARSE, SPARSE_NAMES, day_paths
from dlrm.data.criteo.preprocess import parse_table_sizes
from dlrm.data.criteo.verify import load_manifest, verify_days


def check(directory: str, table_sizes: Sequence[int] | None = None, checksums: bool = True) -> int:
    """Verify every day of `directory`, printing one line per day.

    Args:
        table_sizes: the 26 tables' rows ids must lie below; None: the manifest's.
        checksums: also compare each file's sha256 with the manifest's.

    Returns:
        The rows of all days.

    Raises:
        UserError: a bad manifest or table sizes, or the first bad file (a CriteoDataError).
    """
    manifest = load_manifest(directory)
    sizes = table_sizes or manifest.get("table_sizes") or [2**63 - 1] * NUM_SPARSE
    if not isinstance(sizes, list) or len(sizes) != NUM_SPARSE or not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise UserError(
            f"{directory}/manifest.json: table_sizes {sizes!r} is not {NUM_SPARSE} positive integers; "
            "re-run the preprocessing or give --table-sizes"
        )
    total = 0
    for meta in sorted(manifest["days"], key=lambda d: d["day"]):
        t0 = time.perf_counter()
        verify_days(directory, manifest, [meta["day"]], SPARSE_NAMES, sizes, checksums)
        size = sum(os.path.getsize(p) for p in day_paths(directory, meta["day"]).values())
        total += meta["rows"]
        print(
            f"day {meta['day']}: {meta['rows']:,} rows, {len(KINDS)} files, {size / 1e6:,.1f} MB ok "
            f"({'sha256 checked' if checksums else 'no checksums'}, {time.perf_counter() - t0:.1f}s)",
            flush=True,
        )
    return total


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(
        prog="python -m dlrm.data.criteo.check",
        description=(__doc__ or "").splitlines()[0],
    )
    ap.add_argument("dir", help="the --out directory of `python -m dlrm.data.criteo.preprocess`")
    ap.add_argument("--no-checksums", action="store_true", help="skip each file's sha256 (the other checks still run)")
    ap.add_argument(
        "--table-sizes",
        default=None,
        help="kaggle | 1tb | N | n1,..,n26: check ids against these table rows (default: the manifest's)",
    )
    try:
        a = ap.parse_args(argv)
        total = check(a.dir, parse_table_sizes(a.table_sizes), not a.no_checksums)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{a.dir}: {total:,} rows ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
