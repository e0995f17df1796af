"""Progressive validation in one command: train day by day over a range of periods, evaluating each
next period before training on it.

    python -m dlrm.progressive --periods 1:4 --out outputs/daily -- -cd myconf model=log data=log

For each period k after the first, one `python -m dlrm.train` continues the run in --out on the
periods up to k - 1 (`data.parquet.periods.train=[first, k-1]`, one pass over the rows not read yet:
`trainer.max_epochs=1`, `trainer.resume=auto`) and evaluates on period k
(`data.parquet.periods.eval=[k,k]`), which it has not trained on. The overrides after `--` are the
run's (model, data, optimizers); the dataset must be partitioned (`data.parquet.periods.key`).
Prints a table per evaluated period (rows trained, AUC, NE, calibration, seconds) and writes it to
OUT/progressive.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dlrm.common.errors import ArgumentParser, UsageError, UserError
from dlrm.common.io import write_json_atomic

FIGURES = ("auc", "ne", "calibration")


def period_range(text: str) -> list[int]:
    """ "1:4" -> [1, 2, 3, 4] (integer periods, both ends included, at least two)."""
    first, sep, last = text.partition(":")
    try:
        a, b = int(first), int(last)
    except ValueError:
        a, b = 0, -1
    if not sep or b <= a:
        raise UsageError(f"--periods {text!r}: give FIRST:LAST, two integer periods, FIRST < LAST (e.g. 1:7)")
    return list(range(a, b + 1))


def day_overrides(periods: list[int], k: int, out: Path) -> list[str]:
    """The training overrides of the invocation that trains up to period k - 1 and evaluates period k."""
    return [
        f"data.parquet.periods.train=[{periods[0]},{k - 1}]",
        f"data.parquet.periods.eval=[{k},{k}]",
        "trainer.max_epochs=1",
        "trainer.resume=auto",
        f"hydra.run.dir={out}",
    ]


def row_of(k: int, summary: dict, seconds: float) -> dict:
    """One table row: the evaluated period's figures from a run's summary.json."""
    figures = (summary.get("eval_periods") or {}).get(str(k), {})
    this = summary.get("this_invocation", {})
    return {
        "period": k,
        "rows_trained": int(this.get("steps", 0)) * int(summary.get("global_batch_size", 0)),
        "steps": summary.get("steps"),
        "eval_samples": figures.get("samples"),
        **{f: figures.get(f) for f in FIGURES},
        "seconds": round(seconds, 2),
    }


def table_lines(rows: list[dict]) -> list[str]:
    """The summary table: one line per evaluated period."""

    def num(v, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = [f"{'period':>6} {'rows trained':>12} {'auc':>7} {'ne':>7} {'calibration':>11} {'seconds':>8}"]
    for r in rows:
        lines.append(
            f"{r['period']:>6} {r['rows_trained']:>12,} {num(r['auc'], '.4f'):>7} {num(r['ne'], '.4f'):>7} "
            f"{num(r['calibration'], '.4f'):>11} {r['seconds']:>8.1f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    rest = args[args.index("--") + 1 :] if "--" in args else []
    own = args[: args.index("--")] if "--" in args else args
    ap = ArgumentParser(prog="python -m dlrm.progressive", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--periods", required=True, help="FIRST:LAST integer periods, e.g. 1:7")
    ap.add_argument("--out", required=True, type=Path, help="the run directory (continued if it holds checkpoints)")
    try:
        a = ap.parse_args(own)
        periods = period_range(a.periods)
        out = a.out.resolve()
        rows = []
        for k in periods[1:]:
            command = [sys.executable, "-m", "dlrm.train", *rest, *day_overrides(periods, k, out)]
            started = time.perf_counter()
            done = subprocess.run(command, env=os.environ.copy())
            if done.returncode:
                print(f"error: training up to period {k - 1} exited {done.returncode} (see above)", file=sys.stderr)
                return done.returncode
            summary = json.loads((out / "summary.json").read_text())
            rows.append(row_of(k, summary, time.perf_counter() - started))
            if rows[-1]["auc"] is None and rows[-1]["eval_samples"] is None:
                raise UserError(f"period {k} was not evaluated: it holds less than one global batch, or none")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json_atomic(out / "progressive.json", {"periods": rows})
    print("\n".join(["progressive validation (each period evaluated before training on it):", *table_lines(rows)]))
    print(f"table: {out / 'progressive.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
