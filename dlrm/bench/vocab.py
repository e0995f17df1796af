"""A managed vocabulary against modulo hashing at equal table memory: eval AUC and samples/s.

    python -m dlrm.bench.vocab                          # 6 days of 30,000 rows, tables of 4,096 rows
    python -m dlrm.bench.vocab --days 4 --rows-per-day 10000 --table-rows 2048 --out vocab.json

The log is generated (`click_log`): days in time order, each bringing new users and items with
63-bit ids while older ones fade, labels from a known model, so the Bayes AUC is known. The same
DLRM (one dense feature, a user and an item table of `--table-rows` rows, dim 8) trains one pass
over every day but the last with Adagrad, once per id mapping, and is evaluated on the last day:
- modulo: row = id mod rows;
- managed: the tables' vocabularies (`--policy`): a row per id while there is room, eviction when
  full; its state is held on top of the tables.
Prints one line per mapping (eval AUC, log loss, training samples/s) and the Bayes AUC; `--out`
writes them as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.common.io import write_json_atomic
from dlrm.config import ModelConfig, TableConfig, VocabularyConfig
from dlrm.config.choices import VocabularyPolicy
from dlrm.models.dlrm import build_model, initialize
from dlrm.trainer.metrics import auc_and_logloss

COLUMNS = ("user", "item")


def click_log(days: int, rows_per_day: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`days` days of rows: {"user", "item": int64 63-bit ids, "x": float32 [n, 1], "label": float32,
    "logit": the generating model's}. Each day brings new users and items (a quarter of each day's
    population); an entity's draw weight is Zipf in its rank times exp(-age / 2 days)."""
    rng = np.random.default_rng(seed)
    out = []
    pools = {c: (np.empty(0, np.int64), np.empty(0), np.empty(0)) for c in COLUMNS}  # ids, effects, birth days
    new_per_day = {"user": rows_per_day // 6, "item": rows_per_day // 20}
    for day in range(days):
        columns = {}
        effects = np.zeros(rows_per_day)
        for c in COLUMNS:
            ids, effect, born = pools[c]
            fresh = new_per_day[c] * (3 if day == 0 else 1)
            ids = np.concatenate([ids, rng.integers(1, 1 << 62, fresh, dtype=np.int64) * 2 + 1])
            effect = np.concatenate([effect, rng.normal(0.0, 1.0, fresh)])
            born = np.concatenate([born, np.full(fresh, day)])
            pools[c] = (ids, effect, born)
            weight = np.exp(-(day - born) / 2.0) / (1.0 + rng.permutation(len(ids))) ** 0.8
            pick = rng.choice(len(ids), rows_per_day, p=weight / weight.sum())
            columns[c] = ids[pick]
            effects += effect[pick]
        x = rng.normal(0.0, 1.0, (rows_per_day, 1)).astype(np.float32)
        logit = 1.2 * effects + 0.5 * x[:, 0] - 1.0
        label = (rng.random(rows_per_day) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        out.append({**columns, "x": x, "label": label, "logit": logit})
    return out


def model_config(table_rows: int, policy: str) -> ModelConfig:
    """The bench's DLRM: dense [B, 1], a user and an item table of `table_rows` rows, dim 8."""
    tables = [
        TableConfig(
            name=f"t_{c}",
            rows=table_rows,
            dim=8,
            features=[c],
            vocabulary=VocabularyConfig(policy=VocabularyPolicy(policy)),
        )
        for c in COLUMNS
    ]
    cfg = ModelConfig(dense_in_features=1, bottom_mlp=[16, 8], top_mlp=[16, 1], tables=tables)
    cfg.check()
    return cfg


def batches(day: dict[str, np.ndarray], batch_size: int, modulo: int | None):
    """The day's rows in batches of `batch_size` (the last partial one dropped): ids mod `modulo`, or raw."""
    for start in range(0, len(day["label"]) - batch_size + 1, batch_size):
        part = slice(start, start + batch_size)
        ids = [torch.from_numpy(day[c][part]) for c in COLUMNS]
        values = torch.cat(ids) if modulo is None else torch.cat(ids) % modulo
        sparse = KeyedJaggedTensor(
            keys=list(COLUMNS), values=values, lengths=torch.ones(len(COLUMNS) * batch_size, dtype=torch.int32)
        )
        yield Batch(
            dense_features=torch.from_numpy(day["x"][part]),
            sparse_features=sparse,
            labels=torch.from_numpy(day["label"][part]),
        )


def run(log: list[dict[str, np.ndarray]], table_rows: int, policy: str, batch_size: int, lr: float) -> dict:
    """Train on every day but the last, evaluate on the last.

    Args:
        log: the days of rows from `click_log`.
        table_rows: rows of the user and the item table.
        policy: the vocabulary policy, or "none" for ids modulo the table rows.
        batch_size: rows per training batch.
        lr: Adagrad's learning rate.

    Returns:
        {"eval_auc", "eval_logloss", "samples_per_s"}.
    """
    managed = policy != "none"
    cfg = model_config(table_rows, policy)
    model = build_model(cfg, torch.device("cpu"))
    initialize(model, cfg, seed=0)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
    modulo = None if managed else table_rows
    samples, start = 0, time.perf_counter()
    model.train()
    for day in log[:-1]:
        for batch in batches(day, batch_size, modulo):
            loss, _ = model(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            samples += batch_size
    seconds = time.perf_counter() - start
    model.eval()
    logits, labels = [], []
    with torch.no_grad():
        for batch in batches(log[-1], batch_size, modulo):
            _, (_, logit, label) = model(batch)
            logits.append(logit)
            labels.append(label)
    auc, logloss = auc_and_logloss(torch.cat(logits), torch.cat(labels))
    return {"eval_auc": auc, "eval_logloss": logloss, "samples_per_s": samples / seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlrm.bench.vocab", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--days", type=int, default=6, help="days of the log; the last is evaluated (default 6)")
    p.add_argument("--rows-per-day", type=int, default=30_000)
    p.add_argument("--table-rows", type=int, default=4096, help="rows of each table, the same for both mappings")
    p.add_argument("--policy", default="lfu", choices=("lfu", "lru", "distance_lfu"), help="the vocabulary's")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05, help="Adagrad's, for tables and MLPs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1: steadier timings)")
    p.add_argument("--out", help="write the figures here as JSON")
    a = p.parse_args(argv)
    for name in ("days", "rows_per_day", "table_rows", "batch_size", "threads"):
        if getattr(a, name) < (2 if name in ("days", "table_rows") else 1):
            print(f"error: --{name.replace('_', '-')} {getattr(a, name)} is too small", file=sys.stderr)
            return 2
    if a.rows_per_day < a.batch_size:
        print(f"error: --rows-per-day {a.rows_per_day} is below one --batch-size {a.batch_size}", file=sys.stderr)
        return 2
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    log = click_log(a.days, a.rows_per_day, a.seed)
    last = log[-1]
    bayes, _ = auc_and_logloss(torch.from_numpy(last["logit"]), torch.from_numpy(last["label"]))
    distinct = {c: len(np.unique(np.concatenate([d[c] for d in log]))) for c in COLUMNS}
    figures: dict = {"bayes_auc": bayes, "distinct_ids": distinct, "table_rows": a.table_rows, "policy": a.policy}
    print(
        f"log: {a.days} days x {a.rows_per_day:,} rows; distinct users {distinct['user']:,}, items "
        f"{distinct['item']:,}; tables of {a.table_rows:,} rows; Bayes AUC {bayes:.4f}"
    )
    for name, policy in (("modulo", "none"), ("managed", a.policy)):
        figures[name] = run(log, a.table_rows, policy, a.batch_size, a.lr)
        f = figures[name]
        print(
            f"{name:8s} eval AUC {f['eval_auc']:.4f}  log loss {f['eval_logloss']:.4f}  "
            f"{f['samples_per_s']:,.0f} samples/s"
        )
    ratio = figures["managed"]["samples_per_s"] / figures["modulo"]["samples_per_s"]
    figures["managed_vs_modulo_samples_per_s"] = ratio
    gain = figures["managed"]["eval_auc"] - figures["modulo"]["eval_auc"]
    print(f"managed - modulo: AUC {gain:+.4f}, x{ratio:.2f} samples/s")
    if a.out:
        write_json_atomic(a.out, figures)
    return 0 if math.isfinite(ratio) else 1


if __name__ == "__main__":
    sys.exit(main())
