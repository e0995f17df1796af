"""The scorer's Criteo inputs: a preprocessed Criteo directory (verified as training verifies it) or a
raw Criteo TSV (plain or .gz) parsed with the preprocessing's options."""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.common.errors import UserError
from dlrm.config import CriteoConfig, ModelConfig
from dlrm.data.criteo.format import NUM_FIELDS, NUM_SPARSE, SPARSE_NAMES, ParseOptions, parse_block
from dlrm.data.criteo.id_remap import to_contiguous
from dlrm.data.criteo.loader import CriteoSource
from dlrm.data.criteo.preprocess import parse_table_sizes
from dlrm.data.criteo.verify import load_manifest

BLOCK_BYTES = 8 << 20  # TSV text parsed at a time


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
    """Batches of a preprocessed Criteo directory's selected rows, in order, verified as training verifies them.

    Args:
        names, rows: the model's features in key order and each feature's table rows.
        days: the days to read (default all), seen as one array.
        eval_fraction: read only the held-out last fraction of those rows instead (0: all of them).
        max_rows: keep the first max_rows rows if given.
        multi_hot_sizes: ids per sample of each feature, as training expanded them.
        checksums: verify the files' sha256.

    Raises:
        UserError: a day is named twice or absent from the manifest, or eval_fraction is outside [0, 1).
    """
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
