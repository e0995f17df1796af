"""Model quality of the documented own-data path against careful hand preprocessing, same trainer.

    python -m dlrm.bench.quality --work /tmp/quality --rows 350000 --steps 300 --batch 1024

Writes a team-shaped log with a known generating model (one CSV per day), then trains twice on the
same rows with the same model sizes, steps, batch and seed, evaluating on the last day:
- default: `convert --multi tags`, `inspect --label click`, then training with the generated
  config groups and the eval day as data.parquet.eval_path;
- hand: each categorical column mapped to 0..n-1 over the train days (an unseen value: row 0), the
  counts and prices log1p'd and standardised with missing flags, the row id, day and hour dropped.
Each path runs `--repeats` times, alternated (AUC and memory of the first run, samples/s the best).
Prints eval AUC, peak RSS and train samples/s of each and their ratios, and writes them as JSON to
WORK/quality.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import yaml

from dlrm.bench.teamlog import write_log
from dlrm.common.errors import ArgumentParser

CATEGORICAL = ("user", "item", "category")


def _run(argv: list[str], cwd: Path) -> str:
    r = subprocess.run([sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"error: {' '.join(argv[:3])} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
    return r.stdout + r.stderr


def _read(paths: list[str]) -> pa.Table:
    opts = pacsv.ConvertOptions(column_types={"user": pa.string(), "item": pa.string(), "tags": pa.string()})
    return pa.concat_tables([pacsv.read_csv(p, convert_options=opts) for p in paths])


def _dense(column: pa.ChunkedArray, stats: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray, tuple]:
    x = column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
    missing = np.isnan(x)
    x = np.log1p(np.nan_to_num(x, nan=0.0))
    if stats is None:
        stats = (float(x[~missing].mean()), float(x[~missing].std()) or 1.0)
    x = np.where(missing, 0.0, (x - stats[0]) / stats[1])
    return x.astype(np.float32), missing.astype(np.float32), stats


# long: the careful engineer's preprocessing, one column at a time
def hand_preprocess(train_csv: list[str], eval_csv: list[str], out: Path) -> dict:
    """Write out/train.parquet and out/eval.parquet, preprocessed by hand; returns {column: rows}."""
    train, evals = _read(train_csv), _read(eval_csv)
    rows, stats, tables = {}, {}, {"train": {}, "eval": {}}
    for c in CATEGORICAL:
        vocab = np.unique(train[c].to_numpy(zero_copy_only=False).astype(str))
        rows[c] = len(vocab) + 1
        for split, t in (("train", train), ("eval", evals)):
            v = t[c].to_numpy(zero_copy_only=False).astype(str)
            k = np.searchsorted(vocab, v)
            k = np.minimum(k, len(vocab) - 1)
            tables[split][c] = np.where(vocab[k] == v, k + 1, 0)  # unseen: row 0
    rows["tags"] = 200
    for split, t in (("train", train), ("eval", evals)):
        for c in ("n_views", "price_cents"):
            value, flag, stats[c] = _dense(t[c], stats.get(c))
            tables[split][c], tables[split][f"{c}_missing"] = value, flag
        cells = t["tags"].to_pylist()
        tags = [[int(x) for x in (s or "").split("|") if x] for s in cells]
        tables[split]["tags"] = pa.array(tags, pa.list_(pa.int64()))
        tables[split]["click"] = t["click"]
        pq.write_table(pa.table(tables[split]), out / f"{split}.parquet", row_group_size=1024)
    return rows


def _hand_configs(conf: Path, default: str, data_dir: Path, rows: dict, batch: int, eval_batches: int) -> None:
    model = yaml.safe_load((conf / "model" / f"{default}.yaml").read_text())
    dim = model["tables"][0]["dim"]
    dense = ["n_views", "price_cents", "n_views_missing", "price_cents_missing"]
    model["dense_in_features"] = len(dense)
    model["tables"] = [
        {"name": f"t_{c}", "rows": r, "dim": dim, "features": [c], "pooling": 2.0 if c == "tags" else 1.0}
        for c, r in rows.items()
    ]
    data = {
        "source": "parquet",
        "global_batch_size": batch,
        "eval_batches": eval_batches,
        "parquet": {
            "path": str(data_dir / "train.parquet"),
            "eval_path": str(data_dir / "eval.parquet"),
            "dense": dense,
            "sparse": [{"name": c, "kind": "ids" if c == "tags" else "id"} for c in rows],
            "labels": ["click"],
            "id_policy": "refuse",
        },
    }
    (conf / "model" / "hand.yaml").write_text(yaml.safe_dump(model))
    (conf / "data" / "hand.yaml").write_text(yaml.safe_dump(data))


def _train(work: Path, conf: Path, name: str, steps: int, batch: int, eval_batches: int, extra: list[str]) -> dict:
    _run(
        [
            "dlrm.train",
            "-cd",
            str(conf),
            f"model={name}",
            f"data={name}",
            f"trainer.max_steps={steps}",
            f"data.global_batch_size={batch}",
            f"data.eval_batches={eval_batches}",
            *extra,
        ],
        work,
    )
    run = next(x.split("=", 1)[1] for x in extra if x.startswith("run.name="))
    summary = json.loads((work / "outputs" / run / "summary.json").read_text())
    return {
        "eval_auc": summary["eval_auc"],
        "peak_rss_mb": max(summary["peak_rss_mb_per_rank"]),
        "samples_per_s": summary["train_samples_per_s"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m dlrm.bench.quality", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--work", required=True, help="a new directory for the data, configs and runs")
    ap.add_argument("--rows", type=int, default=350_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each path, alternated (samples/s: the best)")
    a = ap.parse_args(argv)
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = write_log(work / "csv", a.rows, a.days)
    train_csv, eval_csv = log["files"][:-1], log["files"][-1:]
    env_cmds = [
        ["dlrm.data.convert", *train_csv, "--out", str(work / "pq" / "train"), "--multi", "tags"],
        ["dlrm.data.convert", *eval_csv, "--out", str(work / "pq" / "eval"), "--multi", "tags"],
        ["dlrm.data.inspect", str(work / "pq" / "train"), "--out", str(work / "conf"), "--name", "team"],
    ]
    env_cmds[2] += ["--label", "click"]
    outputs = [_run(cmd, work) for cmd in env_cmds]
    print(outputs[2])
    (work / "hand").mkdir(exist_ok=True)
    rows = hand_preprocess(train_csv, eval_csv, work / "hand")
    eval_batches = (a.rows // a.days) // a.batch
    _hand_configs(work / "conf", "team", work / "hand", rows, a.batch, eval_batches)
    split = [f"data.parquet.eval_path={work / 'pq' / 'eval'}", "data.parquet.eval_fraction=0"]
    runs: dict[str, list[dict]] = {"team": [], "hand": []}
    for r in range(a.repeats):  # alternated, so a neighbour's load falls on both alike
        for name, extra in (("team", split), ("hand", [])):
            runs[name].append(
                _train(work, work / "conf", name, a.steps, a.batch, eval_batches, [*extra, f"run.name=q{r}_{name}"])
            )
    default, hand = (
        {**runs[n][0], "samples_per_s": max(x["samples_per_s"] for x in runs[n])} for n in ("team", "hand")
    )
    result = {
        "rows": a.rows,
        "steps": a.steps,
        "batch": a.batch,
        "bayes_auc": log["bayes_auc"],
        "default": default,
        "hand": hand,
        "auc_gap": hand["eval_auc"] - default["eval_auc"],
        "memory_ratio": default["peak_rss_mb"] / hand["peak_rss_mb"],
        "speed_ratio": default["samples_per_s"] / hand["samples_per_s"],
        "cpus": os.cpu_count(),
    }
    (work / "quality.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
