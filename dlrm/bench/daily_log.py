"""A generated multi-day click log, and what training over time costs and gains on it.

`write DIR`: days 1..N of a log partitioned as `DIR/day=D/part-0.parquet` (label, dense f0..f3,
sparse c0..c3), each day bringing new ids: day d draws each feature's ids from the first
BASE_IDS + d * NEW_IDS ids, the newest the most popular, and the label from a hidden logistic model
of per-id effects and the dense features, so a model must learn each new day's ids.

`measure`: on such a log, for each day d > 1, the AUC on day d of (a) the model continued day by
day (`dlrm.progressive`: one pass over each new day, from the previous day's checkpoint) and (b)
a model trained from scratch on days 1..d-1 (one pass), with each one's wall time; then the size of
a delta published after one day against a full export, and samples/s with and without the
tracking of changed rows. Run from the repository root (see docs/training-over-time.md):

    python -m dlrm.bench.daily_log write data/log --days 4
    python -m dlrm.bench.daily_log measure --days 4 --out daily_log.json
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlrm.common.errors import ArgumentParser, UsageError, UserError

FEATURES, DENSE = 4, 4
TABLE_ROWS = 4096  # every feature's table: room for BASE_IDS + days * NEW_IDS ids
BASE_IDS, NEW_IDS = 400, 300
ROW_GROUP = 512


def day_table(day: int, rows: int, seed: int):
    """Day `day`'s rows (a pyarrow Table): label, f0..f3, c0..c3."""
    import pyarrow as pa

    effects = np.random.default_rng([seed, 0]).normal(0.0, 1.2, (FEATURES, TABLE_ROWS))  # per-id, fixed
    dense_w = np.random.default_rng([seed, 1]).normal(0.0, 0.5, DENSE)
    rng = np.random.default_rng([seed, 2, day])
    pool = BASE_IDS + day * NEW_IDS
    if pool > TABLE_ROWS:
        raise UsageError(f"--days allows {(TABLE_ROWS - BASE_IDS) // NEW_IDS} days at most ({TABLE_ROWS} ids a table)")
    newest = np.minimum(rng.zipf(1.3, (FEATURES, rows)) - 1, pool - 1)  # 0: the newest id
    ids = pool - 1 - newest
    dense = rng.normal(size=(rows, DENSE)).astype(np.float32)
    logit = sum(effects[f, ids[f]] for f in range(FEATURES)) / 2 + dense @ dense_w - 1.0
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    columns = {"label": labels}
    columns |= {f"f{j}": dense[:, j] for j in range(DENSE)}
    columns |= {f"c{f}": ids[f].astype(np.int64) for f in range(FEATURES)}
    return pa.table(columns)


def write_log(out: Path, days: int, rows_per_day: int, seed: int = 0) -> list[Path]:
    """Days 1..`days` under out/day=D/part-0.parquet (each written whole, then renamed); the paths."""
    import pyarrow.parquet as pq

    from dlrm.common.io import atomic_path
    from dlrm.data.parquet.files import write_options

    paths = []
    for day in range(1, days + 1):
        table = day_table(day, rows_per_day, seed)
        path = out / f"day={day}" / "part-0.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, row_group_size=ROW_GROUP, **write_options(table.schema))
        paths.append(path)
    return paths


def overrides(data: Path) -> list[str]:
    """The `dlrm.train` overrides of a small model on a log written by `write_log` (partitioned by day)."""
    tables = ",".join(f"{{name:t{f},rows:{TABLE_ROWS},dim:8,features:[c{f}]}}" for f in range(FEATURES))
    return [
        "model=tiny",
        f"model.dense_in_features={DENSE}",
        f"model.tables=[{tables}]",
        "data.source=parquet",
        f"data.parquet.path={data}",
        f"data.parquet.dense=[{','.join(f'f{j}' for j in range(DENSE))}]",
        f"data.parquet.sparse=[{','.join(f'{{name:c{f}}}' for f in range(FEATURES))}]",
        "data.parquet.labels=[label]",
        "data.parquet.periods.key=day",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.bench.daily_log", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write a generated multi-day log")
    w.add_argument("out", type=Path, help="the directory to write day=1/, day=2/, ... into (new or empty)")
    w.add_argument("--days", type=int, default=4)
    w.add_argument("--rows-per-day", type=int, default=8192)
    w.add_argument("--seed", type=int, default=0)
    try:
        args = ap.parse_args(argv)
        if args.days < 2 or args.rows_per_day < ROW_GROUP:
            raise UsageError(f"give --days >= 2 and --rows-per-day >= {ROW_GROUP}")
        if args.command == "write":
            if args.out.exists() and any(args.out.iterdir()):
                raise UsageError(f"{args.out} is not empty: give a new directory")
            paths = write_log(args.out, args.days, args.rows_per_day, args.seed)
            print(f"wrote {len(paths)} days of {args.rows_per_day:,} rows under {args.out}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
