"""A team-shaped click log with a known generating model, written as one CSV per day.

    python -m dlrm.bench.teamlog OUT_DIR --rows 350000 --days 7

Columns, as a team's export has them: `row_id` (unique), `day`, `user` (63-bit ids from a pool),
`item` (hex strings), `hour` (YYMMDDHH), `category` (a small int), `n_views` (heavy-tailed counts,
one in five missing), `price_cents` (around 1e6, one in five missing), `tags` ("|"-joined ints, 0 to 4 per row) and
`click` (0/1). Clicks come from a logistic model of the user, item, category, tags, log1p of the
views and the standardised price; `bayes_auc` is that model's own AUC on the last day (the best any
learner can do).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlrm.common.errors import ArgumentParser


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels.sum()
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(labels) - pos)))


# long: one column per line, the generating model beside them
def write_log(out: str | Path, rows: int = 350_000, days: int = 7, seed: int = 0) -> dict:
    """Write OUT/day-0.csv ... day-{days-1}.csv (rows/days rows each, in time order); returns
    {"files", "rows", "bayes_auc"}."""
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    users = rng.integers(2**40, 2**63 - 1, 20_000, dtype=np.int64)
    items = rng.integers(0, 2**40, 5_000)
    u_eff, i_eff = rng.normal(0, 0.8, len(users)), rng.normal(0, 0.8, len(items))
    c_eff, t_eff = rng.normal(0, 0.5, 30), rng.normal(0, 0.4, 200)
    per = rows // days
    files, last_scores, last_labels = [], None, None
    for d in range(days):
        n = per
        u = np.minimum(rng.zipf(1.3, n) - 1, len(users) - 1)
        i = np.minimum(rng.zipf(1.2, n) - 1, len(items) - 1)
        c = rng.integers(0, 30, n)
        views = np.floor(rng.pareto(1.1, n) * 5).astype(np.int64)
        price = rng.normal(1e6, 2.5e5, n).clip(1e4).astype(np.int64)
        ntags = rng.integers(0, 5, n)
        tags = [rng.integers(0, 200, k) for k in ntags]
        logit = (
            -1.0
            + u_eff[u]
            + i_eff[i]
            + c_eff[c]
            + np.array([t_eff[t].sum() for t in tags])
            + 0.8 * (np.log1p(views) - 1.2)
            - 0.6 * (price - 1e6) / 2.5e5
        )
        p = 1 / (1 + np.exp(-logit))
        click = (rng.random(n) < p).astype(np.int64)
        views_missing, price_missing = rng.random(n) < 0.2, rng.random(n) < 0.2
        hour = 14102100 + d * 100 + rng.integers(0, 24, n)
        path = out / f"day-{d}.csv"
        with open(path, "w") as f:
            f.write("row_id,day,user,item,hour,category,n_views,price_cents,tags,click\n")
            for k in range(n):
                f.write(
                    f"{d * per + k},{d},{users[u[k]]},{items[i[k]]:x},{hour[k]},{c[k]},"
                    f"{'' if views_missing[k] else views[k]},{'' if price_missing[k] else price[k]},"
                    f"{'|'.join(map(str, tags[k]))},{click[k]}\n"
                )
        files.append(str(path))
        last_scores, last_labels = p, click
    assert last_scores is not None and last_labels is not None
    return {"files": files, "rows": per * days, "bayes_auc": _auc(last_scores, last_labels)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.bench.teamlog", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("out", help="the directory to write day-N.csv to")
    ap.add_argument("--rows", type=int, default=350_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(json.dumps(write_log(a.out, a.rows, a.days, a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
