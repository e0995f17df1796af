# long file: the command line and its two Criteo inputs (a directory, a TSV); Parquet is dlrm.predict_parquet
"""Score rows with an exported model: `python -m dlrm.predict MODEL.pt --data DIR|FILE|GLOB`.

One process, no torchrun. MODEL is a file written by `python -m dlrm.export`. DATA is, for a model
trained on Criteo-shaped data (data.source=criteo or synthetic),
- a directory written by `python -m dlrm.data.criteo.preprocess` (verified like the trainer's loader:
  headers, row counts, ids within the model's tables, finite values, sha256): the rows of `--days`
  (default all, in order) seen as one array, or its held-out last `--eval-fraction` (the rule of
  `data.criteo.eval_fraction`), or
- a raw Criteo TSV (plain or .gz; with a label column, or without one like Kaggle's test.txt),
  parsed with the options recorded in `--options-from DIR`'s manifest.json or given by
  `--table-sizes` (ids hashed `int(hex, 16) % size`, as preprocessing does);
and for a model trained on Parquet (data.source=parquet)
- Parquet files (a file, a directory, a glob or a URI, as data.parquet.path takes them), read with the
  columns its export recorded, every row in file order (`dlrm.predict_parquet`); label columns are
  optional (unlabeled rows are scored only).
`--max-rows N` keeps the first N selected rows: the trainer's eval covers
`data.eval_batches * data.global_batch_size` rows (the last partial batch is dropped).
Writes the click probabilities, float32 [N] in row order ([N, T] for a model of T tasks, one column
per task of model.tasks), to `--out` (atomically); prints AUC and log loss when the rows have labels,
per task when they have one per task (AUC is missing when they hold one class; Criteo rows have one
label, so a model of several tasks scoring them gets its scores only).
"""

from __future__ import annotations

import argparse
import gzip
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import CriteoConfig, ModelConfig
from dlrm.data.criteo.format import MULTI_HOT_SIZES, NUM_FIELDS, NUM_SPARSE, SPARSE_NAMES, ParseOptions, parse_block
from dlrm.data.criteo.id_remap import to_contiguous
from dlrm.data.criteo.loader import CriteoSource
from dlrm.data.criteo.preprocess import parse_table_sizes
from dlrm.data.criteo.verify import load_manifest
from dlrm.errors import ArgumentParser, UserError
from dlrm.export import ExportedData, read_exported
from dlrm.io import atomic_path, refuse_alias
from dlrm.models.dlrm import build_model
from dlrm.predict_parquet import check_source, is_parquet, parquet_batches
from dlrm.trainer.logs import QUIET_LOGGERS
from dlrm.trainer.metrics import auc_and_logloss

BLOCK_BYTES = 8 << 20  # TSV text parsed at a time
QUANTIZE = {"int8": torch.qint8, "fp16": torch.float16}  # TorchRec's inference embedding dtypes


def feature_layout(cfg: ModelConfig) -> tuple[list[str], list[int]]:
    """(feature names in KJT key order, rows of each feature's table); Criteo needs 26 features."""
    names = [f for t in cfg.tables for f in t.features]
    rows = [int(t.rows) for t in cfg.tables for _ in t.features]
    if len(names) != NUM_SPARSE:
        raise UserError(
            f"the model has {len(names)} sparse features ({names[:5]}...) but Criteo rows have "
            f"{NUM_SPARSE} (C1..C26); score it with data of its own shape"
        )
    return names, rows


def to_batch(dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray, names: list[str]) -> Batch:
    """Arrays of b one-hot rows (dense [b, 13], ids [b, 26], labels [b, 1]) -> Batch; KJT values key-major."""
    b = sparse.shape[0]
    return Batch(
        dense_features=torch.from_numpy(np.ascontiguousarray(dense, np.float32)),
        sparse_features=KeyedJaggedTensor(
            keys=names,
            values=torch.from_numpy(np.ascontiguousarray(sparse.T, np.int64).reshape(-1)),
            lengths=torch.ones(NUM_SPARSE * b, dtype=torch.int32),
        ),
        labels=torch.from_numpy(labels.reshape(-1).astype(np.float32)),
    )


# ---------------------------------------------------------------- a preprocessed directory
def directory_batches(
    directory: str,
    names: list[str],
    rows: list[int],
    batch_size: int,
    days: list[int] | None = None,
    eval_fraction: float = 0.0,
    max_rows: int | None = None,
    multi_hot_sizes: list[int] | None = None,
    checksums: bool = True,
) -> Iterator[Batch]:
    """Batches of the selected rows, in order, verified by the trainer's loader (`CriteoSource`)."""
    manifest = load_manifest(directory)
    have = [int(d["day"]) for d in manifest["days"]]
    days = have if days is None else days
    missing = [d for d in days if d not in have]
    if len(set(days)) != len(days):
        twice = sorted({d for d in days if days.count(d) > 1})
        raise UserError(f"--days {','.join(map(str, days))} names day(s) {twice} more than once; name each day once")
    if missing or not days:
        raise UserError(f"--days {days}: {directory}/manifest.json has days {sorted(have)}; choose among them")
    if not 0 <= eval_fraction < 1:
        raise UserError(f"--eval-fraction {eval_fraction}: give a fraction in [0, 1) (0: every row of --days)")
    cfg = CriteoConfig(
        dir=directory,
        train_days=days,
        eval_days=[],
        eval_fraction=eval_fraction,
        multi_hot_sizes=multi_hot_sizes,
        shuffle=False,
        verify_checksums=checksums,
    )
    source = CriteoSource(cfg, names, rows, global_batch_size=1, seed=0)
    split = source.splits["eval" if eval_fraction > 0 else "train"]
    n = split.rows if max_rows is None else min(max_rows, split.rows)
    for start in range(0, n, batch_size):
        yield source.make_batch(split.read(start, min(batch_size, n - start)))


# ---------------------------------------------------------------- a raw TSV
def tsv_options(options_from: str | None, table_sizes: str | None, policy: str | None):
    """(ParseOptions, vocabularies or None) from a preprocessed directory's manifest or from the flags."""
    if (options_from is None) == (table_sizes is None):
        raise UserError(
            "a TSV needs its preprocessing options: give --options-from DIR (the preprocessed training "
            "data) or --table-sizes kaggle|1tb|N|n1,..,n26 (ids hashed into those sizes), not both"
        )
    if table_sizes is not None:
        return ParseOptions(policy or "fail", "modulo", tuple(parse_table_sizes(table_sizes) or ())), None
    assert options_from is not None  # exactly one of the two is given (checked above)
    m = load_manifest(options_from)
    path = os.path.join(options_from, "manifest.json")
    try:
        o, kind = m["options"], m["id_map"]["kind"]
        sizes = None if kind == "contiguous" else o["table_sizes"]
        opts = ParseOptions(
            policy or o["policy"], "none" if kind == "contiguous" else kind, tuple(sizes) if sizes else None
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{path} holds no usable preprocessing options ({e}); give --table-sizes instead") from None
    vocabs = None
    if kind == "contiguous":
        vocabs = []
        for name in SPARSE_NAMES:
            p = os.path.join(options_from, f"vocab_{name}.npy")
            try:
                vocabs.append(np.load(p, allow_pickle=False))
            except (OSError, ValueError) as e:
                raise UserError(f"{p} cannot be read ({e}); re-run the preprocessing of {options_from}") from None
    return opts, vocabs


def _lines(path: str) -> Iterator[tuple[bytes, int]]:
    """(blocks of complete lines, number of the block's first line) of a plain or gzip text file."""
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        f = gzip.GzipFile(fileobj=raw) if gz else raw
        first = 1
        try:
            while block := f.readlines(BLOCK_BYTES):
                buf = b"".join(block)
                if not buf.endswith(b"\n"):
                    buf += b"\n"
                yield buf, first
                first += len(block)
        except (EOFError, OSError) as e:  # a truncated or corrupt gzip stream
            raise UserError(
                f"{path}: the gzip stream is truncated or corrupt after line {first - 1} ({e}); copy the file again"
            ) from None


def tsv_batches(
    path: str,
    opts: ParseOptions,
    vocabs,
    names: list[str],
    rows: list[int],
    batch_size: int,
    counts: dict[str, int],
    max_rows: int | None = None,
) -> Iterator[Batch]:
    """Batches of a Criteo TSV's rows (the first max_rows good ones if given).

    A file without labels (39 fields) gets label 0 (counts['labeled'] = 0).

    Bad lines: ParseOptions.policy fail -> UserError naming the line; skip -> counted in counts['skipped'].
    """
    labeled, left = None, math.inf if max_rows is None else max_rows
    for buf, first in _lines(path):
        if left <= 0:
            return
        if labeled is None:
            labeled = buf[: buf.index(b"\n")].count(b"\t") != NUM_FIELDS - 2
            counts["labeled"] = int(labeled)
        if not labeled:  # give every line a label field so the one parser reads it
            buf = b"0\t" + buf[:-1].replace(b"\n", b"\n0\t") + b"\n"
        p = parse_block(buf, opts, first_line=first)
        if p.bad:
            if opts.policy == "fail":
                raise UserError(f"{p.bad[0].describe(path)}; fix the file or pass --policy skip to drop bad lines")
            counts["skipped"] = counts.get("skipped", 0) + len(p.bad)
        keep = int(min(left, len(p.labels)))
        left -= keep
        dense, sparse, labels = p.dense[:keep], p.sparse[:keep], p.labels[:keep]
        if vocabs is not None:
            sparse = np.stack([to_contiguous(sparse[:, c].astype(np.int64), vocabs[c]) for c in range(NUM_SPARSE)], 1)
        over = sparse.astype(np.int64) >= np.asarray(rows)
        if over.any():
            r, c = (int(i) for i in np.argwhere(over)[0])
            raise UserError(
                f"{path}: column {SPARSE_NAMES[c]} has id {int(sparse[r, c])} but the model's table for "
                f"'{names[c]}' has {rows[c]} rows; give the preprocessing options the model was "
                "trained with (--options-from DIR or --table-sizes)"
            )
        for s in range(0, len(sparse), batch_size):
            yield to_batch(dense[s : s + batch_size], sparse[s : s + batch_size], labels[s : s + batch_size], names)


# ---------------------------------------------------------------- scoring
@torch.inference_mode()
def score(model: torch.nn.Module, batches: Iterator[Batch], tasks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N] for one task, [N, T] for `tasks` T; labels [N] for one label a row, [N, L] for L
    (L = 0: unlabeled rows)) of every batch, in order (float32).
    `model`: the exported DLRMTrain, whose network (`model.model`) gives the logits: no loss."""
    logits, labels = [torch.zeros(0, tasks)], []
    net = cast(torch.nn.Module, model.model)
    for batch in batches:
        logits.append(net(batch.dense_features, batch.sparse_features).float().reshape(-1, tasks))
        labels.append(batch.labels.float().reshape(len(batch.dense_features), -1))
    everything, label_columns = torch.cat(logits), torch.cat(labels) if labels else torch.zeros(0, 1)
    return (
        everything.squeeze(1) if tasks == 1 else everything,
        label_columns.squeeze(1) if label_columns.shape[1] == 1 else label_columns,
    )


def save_atomic(path: Path, scores: np.ndarray) -> None:
    """np.save through the project's atomic writer (dlrm.io)."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, scores)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}; free space or choose another --out") from None


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give comma-separated integers") from None


def _parser() -> ArgumentParser:
    ap = ArgumentParser(
        prog="python -m dlrm.predict",
        description=(__doc__ or "").splitlines()[0],
    )
    ap.add_argument("model", type=Path, help="a file written by `python -m dlrm.export`")
    ap.add_argument(
        "--data",
        required=True,
        help="a dlrm.data.criteo.preprocess directory or a Criteo TSV (plain or .gz); for a model trained on "
        "Parquet: a Parquet file, directory, glob or URI",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the probabilities here (float32 [N], or [N, T] for T tasks, .npy); default: print the metrics only",
    )
    ap.add_argument("--batch-size", type=int, default=4096, help="rows per forward pass")
    ap.add_argument(
        "--quantize",
        choices=("none", *QUANTIZE),
        default="none",
        help="embedding tables for inference: TorchRec's row-wise quantized EmbeddingBagCollection",
    )
    ap.add_argument("--days", default=None, help="directory: days to score, e.g. 0,1 (default: all, in order)")
    ap.add_argument(
        "--eval-fraction",
        type=float,
        default=0.0,
        help="directory: score only the held-out last fraction of --days' rows (data.criteo.eval_fraction)",
    )
    ap.add_argument("--max-rows", type=int, default=None, help="score only the first N selected rows (default: all)")
    ap.add_argument(
        "--multi-hot-sizes",
        default=None,
        help="directory: mlperf | n1,..,n26: synthesise multi-hot ids as data.criteo.multi_hot_sizes",
    )
    ap.add_argument("--no-checksums", action="store_true", help="directory: skip the sha256 of the files")
    ap.add_argument(
        "--options-from",
        default=None,
        help="TSV: parse with the options of this preprocessed directory's manifest.json",
    )
    ap.add_argument("--table-sizes", default=None, help="TSV: kaggle | 1tb | N | n1,..,n26 (ids hashed modulo)")
    ap.add_argument(
        "--policy",
        choices=("fail", "skip"),
        default=None,
        help="TSV: on a bad line stop, or drop and count it (default: the manifest's, else fail)",
    )
    return ap


def _check_args(a: argparse.Namespace) -> None:
    """Refuse bad numbers, a missing or irregular --data, and an --out that is a directory or an input."""
    if a.batch_size < 1 or (a.max_rows is not None and a.max_rows < 0) or not math.isfinite(a.eval_fraction):
        raise UserError(
            f"--batch-size {a.batch_size} / --max-rows {a.max_rows} / --eval-fraction "
            f"{a.eval_fraction}: give a batch size >= 1, rows >= 0 and a finite fraction"
        )
    if not os.path.exists(a.data) and not is_parquet(a.data):  # a glob or URI: dlrm.data.parquet lists it
        raise UserError(
            f"--data {a.data} does not exist; give a dlrm.data.criteo.preprocess directory, a Criteo TSV or "
            "Parquet files"
        )
    if os.path.exists(a.data) and not os.path.isdir(a.data) and not os.path.isfile(a.data):  # a FIFO: a hang
        raise UserError(
            f"--data {a.data} is not a regular file; give a dlrm.data.criteo.preprocess directory or a Criteo TSV"
        )
    if a.out is not None and (a.out.is_dir() or not a.out.parent.is_dir()):
        raise UserError(f"--out {a.out}: give a file path in an existing directory")
    if a.out is not None:
        inputs = {
            "the model": a.model,
            "--data": a.data,
            **({"--options-from": a.options_from} if a.options_from else {}),
        }
        refuse_alias(a.out, "--out", inputs)


def _batches(a: argparse.Namespace, cfg: ModelConfig, data: ExportedData, counts: dict[str, int]) -> Iterator:
    """The batches of --data, read as the model's training data was: Parquet with its recorded columns,
    or Criteo rows."""
    parquet = is_parquet(a.data)
    check_source(a, data, parquet)
    if parquet:
        assert data.parquet is not None
        return parquet_batches(a.data, data.parquet, cfg, a.batch_size, a.max_rows, counts)
    names, rows = feature_layout(cfg)
    return _criteo_batches(a, names, rows, counts)


def _criteo_batches(a: argparse.Namespace, names: list[str], rows: list[int], counts: dict[str, int]) -> Iterator:
    """The batches of --data: a preprocessed directory's, or a TSV's parsed as the options say."""
    if os.path.isdir(a.data):
        if a.options_from or a.table_sizes or a.policy:
            raise UserError("--options-from, --table-sizes and --policy are for a TSV; a directory holds its own")
        multi_hot = None
        if a.multi_hot_sizes:
            mlperf = a.multi_hot_sizes == "mlperf"
            multi_hot = MULTI_HOT_SIZES if mlperf else _int_list(a.multi_hot_sizes, "--multi-hot-sizes")
        days = _int_list(a.days, "--days") if a.days else None
        return directory_batches(
            a.data, names, rows, a.batch_size, days, a.eval_fraction, a.max_rows, multi_hot, not a.no_checksums
        )
    if a.days or a.eval_fraction or a.multi_hot_sizes or a.no_checksums:
        raise UserError(
            "--days, --eval-fraction, --multi-hot-sizes and --no-checksums are for a "
            "preprocessed directory; preprocess the TSV to use them"
        )
    opts, vocabs = tsv_options(a.options_from, a.table_sizes, a.policy)
    return tsv_batches(a.data, opts, vocabs, names, rows, a.batch_size, counts, a.max_rows)


def _run(a: argparse.Namespace) -> tuple[ModelConfig, torch.Tensor, torch.Tensor, dict[str, int], float]:
    """Score --data with the model: (its config, logits, labels, counts, seconds); writes --out."""
    _check_args(a)
    cfg, state, data = read_exported(a.model)
    counts: dict[str, int] = {"labeled": 1}
    batches = _batches(a, cfg, data, counts)
    model = build_model(cfg)
    model.load_state_dict(state, assign=True)
    if a.quantize != "none":  # TorchRec's serving tables: row-wise quantized weights, fbgemm's inference kernels
        from torchrec.inference.modules import quantize_embeddings

        quantize_embeddings(model, dtype=QUANTIZE[a.quantize], inplace=True)
    t0 = time.perf_counter()
    logits, labels = score(model.eval(), batches, len(cfg.tasks))
    seconds = time.perf_counter() - t0
    if not len(logits):
        skipped = f" ({counts['skipped']:,} bad lines skipped)" if counts.get("skipped") else ""
        raise UserError(f"--data {a.data}: no rows to score{skipped}; give a file with rows")
    if a.out is not None:
        save_atomic(a.out, torch.sigmoid(logits).numpy().astype(np.float32))
    return cfg, logits, labels, counts, seconds


def _print_metrics(cfg: ModelConfig, logits: torch.Tensor, labels: torch.Tensor) -> None:
    """AUC and log loss: of the one task, or of each task when the rows have a label per task."""
    tasks = [t.name for t in cfg.tasks]
    if len(tasks) > 1 and labels.dim() == 1:
        print(f"no auc: the rows have one label, the model {len(tasks)} tasks; the scores have a column each")
        return
    for t, task in enumerate(tasks):
        auc, logloss = auc_and_logloss(*((logits, labels) if len(tasks) == 1 else (logits[:, t], labels[:, t])))
        figures = f"auc {'n/a (one class)' if auc is None else f'{auc:.6f}'} logloss {logloss:.6f}"
        print(figures if len(tasks) == 1 else f"{task}: {figures}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    for name, level in QUIET_LOGGERS.items():  # library notices that do not concern scoring
        logging.getLogger(name).setLevel(level)
    try:
        a = ap.parse_args(argv)
        cfg, logits, labels, counts, seconds = _run(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = len(logits)
    line = f"scored {n:,} rows of {a.data} in {seconds:.1f}s ({n / max(seconds, 1e-9):,.0f} rows/s)"
    if counts.get("skipped"):
        line += f", {counts['skipped']:,} bad lines skipped"
    print(line + (f"; wrote {a.out}" if a.out else ""))
    if counts["labeled"]:
        _print_metrics(cfg, logits, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
