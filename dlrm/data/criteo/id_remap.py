"""Contiguous ids, as MLPerf's preprocessing: count each raw id, keep the frequent ones, map them to rows 1..K.

`remap_contiguous` rewrites the sparse files of a preprocessed directory so; `IdCounter` and
`to_contiguous` are its parts.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from dlrm.common.io import atomic_path, publish, sha256_file, write_json_atomic
from dlrm.data.criteo.days import MANIFEST, day_json
from dlrm.data.criteo.format import NUM_SPARSE, SPARSE_NAMES, day_paths
from dlrm.data.criteo.npy import NpyWriter


class IdCounter:
    """Counts of the ids of one sparse column, fed block by block (memory ~ 16 bytes per distinct id)."""

    def __init__(self):
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending, self.merged = 0, 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(np.unique(ids, return_counts=True))
        self.pending += len(self.parts[-1][0])
        if self.pending > 2 * self.merged + (1 << 20):  # merge rarely: amortised O(n log n)
            self._merge()

    def _merge(self) -> None:
        ids = np.concatenate([u for u, _ in self.parts])
        counts = np.concatenate([n for _, n in self.parts])
        uniq, inverse = np.unique(ids, return_inverse=True)
        self.parts = [(uniq, np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64))]
        self.pending = self.merged = len(uniq)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct ids, their counts)."""
        if not self.parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._merge()
        return self.parts[0]


def to_contiguous(raw: np.ndarray, vocab: np.ndarray) -> np.ndarray:
    """Raw ids [n] -> rows: 1 + position in the sorted `vocab`, or 0 for ids not in it. int32 [n]."""
    if len(vocab) == 0:
        return np.zeros(len(raw), np.int32)
    idx = np.searchsorted(vocab, raw)
    found = vocab[np.minimum(idx, len(vocab) - 1)] == raw
    return np.where(found, idx + 1, 0).astype(np.int32)


def _vocabularies(out: str, days: list[dict], min_count: int, block_rows: int) -> list[np.ndarray]:
    """Per column, the sorted ids seen at least `min_count` times over all days (saved as vocab_C{c}.npy)."""
    counters = [IdCounter() for _ in range(NUM_SPARSE)]
    t0 = time.time()
    for meta in days:
        sparse = np.load(day_paths(out, meta["day"])["sparse"], mmap_mode="r")
        for i in range(0, sparse.shape[0], block_rows):
            block = np.asarray(sparse[i : i + block_rows])
            for c in range(NUM_SPARSE):
                counters[c].add(block[:, c])
    vocabs = []
    for c, counter in enumerate(counters):
        ids, counts = counter.result()
        vocabs.append(ids[counts >= min_count])
        path = os.path.join(out, f"vocab_{SPARSE_NAMES[c]}.npy")
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, vocabs[-1])
    print(f"preprocess: contiguous vocabularies built in {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
    return vocabs


def remap_contiguous(out: str, manifest: dict, min_count: int, block_rows: int = 1 << 20) -> dict:
    """Replace raw ids by contiguous rows, as MLPerf's preprocessing: per column, the ids seen at least
    `min_count` times over all days, sorted, get rows 1..K (saved as vocab_C{c}.npy); every other id -> 0.

    Needs ~16 bytes of memory per distinct id of all columns. Rewrites day_{i}_sparse.npy as int32
    [N, 26] (atomically per day) and the day and manifest json files with the new table sizes.

    Returns:
        The new manifest, also written to `out`/manifest.json.
    """
    os.remove(os.path.join(out, MANIFEST))  # unpublished until the remap is complete
    days = manifest["days"]
    vocabs = _vocabularies(out, days, min_count, block_rows)
    stamp = {"contiguous_min_count": min_count}
    for meta in days:
        path = day_paths(out, meta["day"])["sparse"]
        sparse = np.load(path, mmap_mode="r")
        tmp = os.path.join(out, f".tmp_day_{meta['day']}_sparse.npy")
        writer = NpyWriter(tmp, np.int32, NUM_SPARSE)
        max_ids = np.full(NUM_SPARSE, -1, np.int64)
        for i in range(0, sparse.shape[0], block_rows):
            block = np.asarray(sparse[i : i + block_rows])
            mapped = np.stack([to_contiguous(block[:, c], vocabs[c]) for c in range(NUM_SPARSE)], axis=1)
            writer.append(mapped)
            if len(mapped):
                np.maximum(max_ids, mapped.max(0), out=max_ids)
        writer.close()
        del sparse
        publish(tmp, path)
        meta["files"]["sparse"].update(bytes=os.path.getsize(path), sha256=sha256_file(path))
        meta["max_ids"] = max_ids.tolist()
        meta["options"] = {**meta["options"], **stamp, "sparse_dtype": "int32"}
        write_json_atomic(day_json(out, meta["day"]), meta)
    manifest = {
        **manifest,
        "days": days,
        "sparse_dtype": "int32",
        "table_sizes": [len(v) + 1 for v in vocabs],
        "id_map": {
            "kind": "contiguous",
            "min_count": min_count,
            "rule": "row = 1 + index of int(hex, 16) in vocab_C{c}.npy (sorted ids seen >= min_count times "
            "over all input days, missing counted as id 0); any other id -> row 0",
            "vocab_files": [f"vocab_{n}.npy" for n in SPARSE_NAMES],
        },
        "options": {**manifest["options"], **stamp, "sparse_dtype": "int32"},
    }
    write_json_atomic(os.path.join(out, MANIFEST), manifest)
    return manifest
