"""Which rows of each table the training steps change, from the ids their batches look up.

A fused embedding optimizer (SGD, Adagrad, row-wise Adagrad, Adam) updates only the rows a step
looked up, so the rows changed between two steps are the union of the ids of the batches between
them: no table is scanned. The ids are noted as batches are taken (a pipeline takes a few ahead of
the step it trains), each under its step, and handed out up to a step (`take`). The ids are kept
as the batches hold them (repeats too) until taken: a publication cadence of N steps holds N
batches' ids (8 bytes each) on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


class ChangedRows:
    """The ids each step's batch holds, per table, on this rank.

    Args:
        features: the model's features in KJT key order; tables: the table index of each.
    """

    def __init__(self, features: Sequence[str], tables: Sequence[int]) -> None:
        self.table_of = dict(zip(features, tables, strict=True))
        self.n_tables = max(tables, default=-1) + 1
        self.pending: dict[int, list[np.ndarray]] = {}  # step -> per table: the ids of its batch (repeats kept)

    def note(self, step: int, kjt) -> None:
        """Note the ids of `kjt` (a KeyedJaggedTensor) as step `step`'s lookups."""
        values = kjt.values().detach().cpu().numpy()
        bounds = np.concatenate([[0], np.cumsum(kjt.length_per_key())])
        per_table: list[list[np.ndarray]] = [[] for _ in range(self.n_tables)]
        for i, key in enumerate(kjt.keys()):
            per_table[self.table_of[key]].append(values[bounds[i] : bounds[i + 1]])
        # raw ids (duplicates kept): the step pays a slice per feature, `take` the sort (off the step)
        self.pending[step] = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in per_table]

    def watch(self, batches: Iterator, first_step: int) -> Iterator:
        """`batches` (of steps first_step + 1, first_step + 2, ...), noting each one's ids as it is taken."""
        step = first_step
        for batch in batches:
            step += 1
            self.note(step, batch.sparse_features)
            yield batch

    def take(self, step: int) -> list[np.ndarray]:
        """The ids (sorted, unique) of each table looked up by the steps up to `step`, forgotten here."""
        done = [s for s in self.pending if s <= step]
        out = []
        for t in range(self.n_tables):
            parts = [self.pending[s][t] for s in done]
            out.append(np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64))
        for s in done:
            del self.pending[s]
        return out
