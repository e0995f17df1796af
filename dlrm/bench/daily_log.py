"""A generated multi-day click log, and what training over time costs and gains on it.

    python -m dlrm.bench.daily_log write data/log --days 4
    python -m dlrm.bench.daily_log measure --days 4 --out daily_log.json

`write DIR`: days 1..N partitioned as `DIR/day=D/part-0.parquet` (label, dense f0..f3, sparse
c0..c3); day d draws each feature's ids from the first BASE_IDS + d * NEW_IDS ids, the newest the
most popular, and labels from a hidden logistic model of per-id effects and the dense features.

`measure`: for each day d > 1, the AUC on day d and wall time of (a) the model continued day by day
(one pass over each new day from the previous day's checkpoint) and (b) a model trained from
scratch on days 1..d-1; then the size of a one-day delta against a full export, and samples/s with
and without tracking changed rows.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlrm.common.errors import ArgumentParser, UsageError, UserError
from dlrm.common.io import write_json_atomic

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
    """The training overrides of a small model on a log written by `write_log` (partitioned by day)."""
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


def _train(args: list[str], cwd: Path) -> tuple[dict, float]:
    """Run the training command with `args` in `cwd`.

    Returns:
        (the run's summary.json as a dict, its wall seconds).

    Raises:
        UserError: the run failed (the message holds its last line of output).
    """
    run_dir = Path(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")))
    started = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dlrm.train", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise UserError(f"dlrm.train {' '.join(args)} failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    return json.loads((run_dir / "summary.json").read_text()), time.perf_counter() - started


def tracking_cost(base: list[str], days: int, passes: int, rounds: int, work: Path) -> dict:
    """Training samples/s over days 1..days-1 without and with tracking changed rows, alternated.

    Returns:
        {"samples_per_s": {"without": [...], "with": [...]} per round, "tracking_cost": 1 - the ratio
        of the medians, with to without}.
    """
    window = [f"data.parquet.periods.train=[1,{days - 1}]", f"data.parquet.periods.eval=[{days},{days}]"]
    rates: dict[str, list[float]] = {"without": [], "with": []}
    for i in range(rounds):
        for name in ("without", "with") if i % 2 == 0 else ("with", "without"):
            extra = [f"deltas.every_steps={10**9}"] if name == "with" else []  # tracked, published at the end only
            run = f"hydra.run.dir={work / f'rate_{name}_{i}'}"
            args = [*base, *window, f"trainer.max_epochs={passes}", "trainer.log_every_steps=16", *extra, run]
            rates[name].append(_train(args, work)[0]["train_samples_per_s"])
    median = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "samples_per_s": {k: [round(x) for x in v] for k, v in rates.items()},
        "tracking_cost": 1 - median["with"] / median["without"],
    }


def measure(days: int, rows_per_day: int, batch: int, rounds: int, work: Path, tracking_only: bool = False) -> dict:
    """Write a log of `days` days into `work` and measure it.

    Args:
        rows_per_day: rows of each generated day.
        batch: the global batch size of every run.
        rounds: rounds of the with/without tracking comparison.
        tracking_only: measure only the cost of tracking changed rows.

    Returns:
        The figures as a dict: per day the continued and from-scratch eval AUC and wall seconds, the
        delta's and the full export's sizes, and the tracking cost.

    Raises:
        UserError: a training run failed.
    """
    data = work / "log"
    write_log(data, days, rows_per_day)
    base = [*overrides(data), f"data.global_batch_size={batch}", "data.eval_batches=1000", "trainer.progress=none"]
    if tracking_only:
        return {"days": days, "rows_per_day": rows_per_day, "global_batch_size": batch} | tracking_cost(
            base, days, 3, rounds, work
        )
    steps_per_day = rows_per_day // batch
    # (a) continued day by day, one delta per day
    cont = work / "continued"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "dlrm.progressive", "--periods", f"1:{days}", "--out", str(cont), "--"]
    r = subprocess.run([*cmd, *base, f"deltas.every_steps={steps_per_day}"], cwd=work, capture_output=True, text=True)
    if r.returncode:
        raise UserError(f"dlrm.progressive failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    continued = json.loads((cont / "progressive.json").read_text())["periods"]
    continued_s = time.perf_counter() - started
    # (b) from scratch on days 1..d-1, one pass
    scratch = []
    for d in range(2, days + 1):
        window = [f"data.parquet.periods.train=[1,{d - 1}]", f"data.parquet.periods.eval=[{d},{d}]"]
        args = [*base, *window, "trainer.max_epochs=1", f"hydra.run.dir={work / f'scratch_{d}'}"]
        summary, seconds = _train(args, work)
        scratch.append({"period": d, "auc": summary["eval_periods"][str(d)]["auc"], "seconds": round(seconds, 2)})
    # a delta after one day against a full export
    from dlrm.deltas.publish import read_manifest

    deltas = read_manifest(cont / "deltas")
    last = max(int(p.name.removeprefix("step_")) for p in (cont / "checkpoints").glob("step_*"))
    full = work / "full.pt"
    subprocess.run(
        [sys.executable, "-m", "dlrm.export", str(cont / "checkpoints" / f"step_{last:08d}"), str(full)],
        cwd=work,
        check=True,
        capture_output=True,
    )
    return {
        "days": days,
        "rows_per_day": rows_per_day,
        "global_batch_size": batch,
        "next_day_auc": [
            {
                "period": c["period"],
                "continued": c["auc"],
                "continued_s": c["seconds"],
                "scratch": s["auc"],
                "scratch_s": s["seconds"],
            }
            for c, s in zip(continued, scratch, strict=True)
        ],  # fmt: skip
        "continued_total_s": round(continued_s, 2),
        "scratch_total_s": round(sum(s["seconds"] for s in scratch), 2),
        "delta_bytes_one_day": deltas[-1]["bytes"] if deltas else None,
        "delta_rows_one_day": deltas[-1]["rows"] if deltas else None,
        "full_export_bytes": full.stat().st_size,
    } | tracking_cost(base, days, 3, rounds, work)


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.bench.daily_log", description=(__doc__ or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write a generated multi-day log")
    w.add_argument("out", type=Path, help="the directory to write day=1/, day=2/, ... into (new or empty)")
    w.add_argument("--days", type=int, default=4)
    w.add_argument("--rows-per-day", type=int, default=8192)
    w.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("measure", help="next-day AUC continuing vs from scratch, delta size, tracking cost")
    m.add_argument("--days", type=int, default=4)
    m.add_argument("--rows-per-day", type=int, default=8192)
    m.add_argument("--batch", type=int, default=512, help="global batch size")
    m.add_argument("--rounds", type=int, default=3, help="runs with and without tracking, alternating")
    m.add_argument("--out", type=Path, required=True, help="the JSON file of the figures")
    m.add_argument("--tracking-only", action="store_true", help="only the cost of tracking changed rows")
    try:
        args = ap.parse_args(argv)
        if args.days < 2 or args.rows_per_day < ROW_GROUP:
            raise UsageError(f"give --days >= 2 and --rows-per-day >= {ROW_GROUP}")
        if args.command == "write":
            if args.out.exists() and any(args.out.iterdir()):
                raise UsageError(f"{args.out} is not empty: give a new directory")
            paths = write_log(args.out, args.days, args.rows_per_day, args.seed)
            print(f"wrote {len(paths)} days of {args.rows_per_day:,} rows under {args.out}")
        else:
            with tempfile.TemporaryDirectory(prefix="daily-log-") as work:
                figures = measure(args.days, args.rows_per_day, args.batch, args.rounds, Path(work), args.tracking_only)
            write_json_atomic(args.out, figures)
            print(json.dumps(figures, indent=2))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
