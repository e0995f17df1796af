"""Score rows with an exported model: `python -m dlrm.predict MODEL.pt --data DIR|FILE|GLOB`.

One process, no torchrun. MODEL is an exported file, or a bundle directory (its compiled program
scores the same batches). DATA is, for a model trained on Criteo-shaped data (criteo or synthetic),
- a preprocessed Criteo directory (verified as training verifies it): the rows of `--days` (default
  all) as one array, or its held-out last `--eval-fraction`, or
- a raw Criteo TSV (plain or .gz, with or without a label column), parsed with the options in
  `--options-from DIR`'s manifest.json or given by `--table-sizes`;
and for a model trained on Parquet, Parquet files (a file, directory, glob or URI) read with the
columns its export recorded, in file order; label columns are optional.
`--max-rows N` keeps the first N selected rows. Writes the click probabilities, float32 [N] in row
order ([N, T] for T tasks), to `--out` atomically; prints AUC and log loss where the rows have
labels (per task, weighted where the model was trained with a sample-weight column the files have;
AUC is missing where the rows hold one class). Criteo rows have one label, so a model of several
tasks scoring them gets its scores only.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.common.io import refuse_alias
from dlrm.config import ModelConfig
from dlrm.data.criteo.format import MULTI_HOT_SIZES
from dlrm.export import ExportedData, read_exported
from dlrm.models.dlrm import build_model
from dlrm.predict.bundle import bundle_logits, is_bundle, read_bundle
from dlrm.predict.criteo import directory_batches, feature_layout, tsv_batches, tsv_options
from dlrm.predict.parquet import check_source, is_parquet, parquet_batches
from dlrm.predict.score import QUANTIZE, save_atomic, score
from dlrm.run.logs import QUIET_LOGGERS
from dlrm.trainer.metrics import auc_and_logloss, weighted_auc_and_logloss


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
    ap.add_argument(
        "model", type=Path, help="a file written by `python -m dlrm.export`, or a bundle (--format bundle) directory"
    )
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


def _batches(
    a: argparse.Namespace, cfg: ModelConfig, data: ExportedData, counts: dict[str, int], raw_dense: bool = False
) -> Iterator:
    """The batches of --data, read as the model's training data was: Parquet with its recorded columns
    (raw_dense: dense values as read, for a bundle that transforms them), or Criteo rows."""
    parquet = is_parquet(a.data)
    check_source(a, data, parquet)
    if parquet:
        assert data.parquet is not None
        return parquet_batches(a.data, data.parquet, cfg, a.batch_size, a.max_rows, counts, raw_dense)
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


def _keeping_weights(batches: Iterator, kept: list[torch.Tensor]) -> Iterator:
    """Yield `batches`, appending each weighted batch's sample weights [B] to `kept`."""
    for batch in batches:
        if getattr(batch, "weights", None) is not None:
            kept.append(batch.weights.float())
        yield batch


def _run(a: argparse.Namespace) -> tuple[ModelConfig, torch.Tensor, torch.Tensor, torch.Tensor | None, dict, float]:
    """Score --data with the model and write the probabilities to --out.

    Returns:
        (the model config, logits [N] or [N, T], labels [N] or [N, L] (L = 0: unlabeled rows), sample
        weights [N] or None, counts, seconds).

    Raises:
        UserError: bad arguments, no rows to score, or a row scored as NaN or infinite (nothing written).
    """
    _check_args(a)
    counts: dict[str, int] = {"labeled": 1}
    kept: list[torch.Tensor] = []
    if is_bundle(a.model):
        if a.quantize != "none":
            raise UserError(f"--quantize {a.quantize}: a bundle's tables are as exported; export it with --int8")
        cfg, data, runner = read_bundle(a.model)
        in_program = data.parquet is not None and bool(data.parquet.dense_transforms)  # the program transforms
        batches = _keeping_weights(_batches(a, cfg, data, counts, raw_dense=in_program), kept)
        t0 = time.perf_counter()
        logits, labels = bundle_logits(runner, cfg, batches)
        seconds = time.perf_counter() - t0
    else:
        cfg, state, data = read_exported(a.model)
        batches = _keeping_weights(_batches(a, cfg, data, counts), kept)
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
    bad = (~torch.isfinite(logits)).reshape(len(logits), -1).any(dim=1).nonzero()
    if len(bad):
        raise UserError(
            f"--data {a.data}: the model scores row {int(bad[0])} (0-based, of those scored) as {logits[int(bad[0])]}, "
            "not a number: its inputs reach values the model cannot take; nothing written"
        )
    if a.out is not None:
        save_atomic(a.out, torch.sigmoid(logits).numpy().astype(np.float32))
    return cfg, logits, labels, torch.cat(kept) if kept else None, counts, seconds


def _print_metrics(cfg: ModelConfig, logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None) -> None:
    """AUC and log loss: of the one task, or of each task when the rows have a label per task;
    weighted by the rows' sample weights where given (`weighted_auc_and_logloss`)."""
    tasks = [t.name for t in cfg.tasks]
    if len(tasks) > 1 and labels.dim() == 1:
        print(f"no auc: the rows have one label, the model {len(tasks)} tasks; the scores have a column each")
        return
    for t, task in enumerate(tasks):
        pair = (logits, labels) if len(tasks) == 1 else (logits[:, t], labels[:, t])
        auc, logloss = auc_and_logloss(*pair) if weights is None else weighted_auc_and_logloss(*pair, weights)
        figures = (
            "weighted " if weights is not None else ""
        ) + f"auc {'n/a (one class)' if auc is None else f'{auc:.6f}'} logloss {logloss:.6f}"
        print(figures if len(tasks) == 1 else f"{task}: {figures}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    for name, level in QUIET_LOGGERS.items():  # library notices that do not concern scoring
        logging.getLogger(name).setLevel(level)
    try:
        a = ap.parse_args(argv)
        cfg, logits, labels, weights, counts, seconds = _run(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = len(logits)
    line = f"scored {n:,} rows of {a.data} in {seconds:.1f}s ({n / max(seconds, 1e-9):,.0f} rows/s)"
    if counts.get("skipped"):
        line += f", {counts['skipped']:,} bad lines skipped"
    print(line + (f"; wrote {a.out}" if a.out else ""))
    if counts["labeled"]:
        _print_metrics(cfg, logits, labels, weights)
    return 0
