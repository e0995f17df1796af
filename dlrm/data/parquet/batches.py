"""Rows of the declared columns -> a `Batch`: dense [b, N] float32, the sparse KeyedJaggedTensor
(keys: the model's features in table order, values key-major), labels [b] or [b, T] float32.

The one-id columns (kind id, unweighted), the dense and the label columns are read as blocks (a few
reductions check each); a batch holding a bad value is made column by column, so the first bad value
is named (file, column, row). Ids below 0 or >= the table's rows are refused or, with
id_policy=modulo, folded into the table and counted (`folded_ids`). With
data.parquet.multi_hot_sizes, every column holds one base id per sample, expanded as the Criteo
source expands its files' (`MultiHotLayout`): on the host, or, with `expand_on` (a GPU), where
the batch is moved (`BaseIdBatch`).
"""

# long file: one BatchMaker reads every column kind (ids, lists, strings, weights, dense, labels) into a batch

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from dlrm.config import ParquetConfig, SparseColumnConfig
from dlrm.config.choices import IdPolicy, NonFinitePolicy, SparseKind
from dlrm.data.parquet.files import ParquetDataError, ParquetValueError, compute
from dlrm.data.parquet.hashing import hash_strings
from dlrm.data.parquet.transforms import DenseTransform

if TYPE_CHECKING:  # torch and torchrec where batches are made: the checks start without them
    import torch
    from torchrec.datasets.utils import Batch

    from dlrm.data.multihot import BaseIdBatch, MultiHotLayout

_INT32_MAX = 2**31 - 1
log = logging.getLogger(__name__)


def _list_size(arr: pa.Array) -> int:
    """The number of values a list array's rows hold (between its first and last offsets)."""
    return int(arr.offsets[-1].as_py() - arr.offsets[0].as_py())


def _where(origin: list[tuple], row: int) -> str:
    """'file F, row R' of a batch's row."""
    k = max(i for i, (at, _, _) in enumerate(origin) if at <= row)
    at, path, first = origin[k]
    return f"{path}, row {first + row - at}"


def _array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _runs(features: int, scalar: list[int]) -> list[tuple[int, int, int | None]]:
    """The KJT's features in key order as (first, last, row): features [first, last) are rows [row,
    row + last - first) of the one-id block (`scalar`: their indexes, ascending), or, with row None,
    one feature (last = first + 1) read on its own."""
    runs: list[tuple[int, int, int | None]] = []
    row_of = {f: r for r, f in enumerate(scalar)}
    for f in range(features):
        if f not in row_of:
            runs.append((f, f + 1, None))
        elif runs and runs[-1][2] is not None and runs[-1][1] == f:
            runs[-1] = (runs[-1][0], f + 1, runs[-1][2])
        else:
            runs.append((f, f + 1, row_of[f]))
    return runs


class BatchMaker:
    """Makes and checks the batches of one data.parquet declaration for the model's features.

    Args:
        cfg: the data.parquet section.
        feature_names: the model's sparse features, in KJT key order.
        table_rows: the rows of each feature's table.
        expand_on: with data.parquet.multi_hot_sizes, batches are `BaseIdBatch`es (one id per sample
            and feature) expanded when moved to this device (a GPU); None expands them on the host.
        raw_dense: dense values as read (NaN where missing), not transformed.

    Raises:
        ParquetDataError: a feature without a declared column, or multi-hot sizes that do not fit the
            features.
    """

    def __init__(
        self,
        cfg: ParquetConfig,
        feature_names: Sequence[str],
        table_rows: Sequence[int],
        expand_on: torch.device | None = None,
        raw_dense: bool = False,
    ):
        self.cfg, self.expand_on, self.raw_dense = cfg, expand_on, raw_dense
        self.names, self.table_rows = list(feature_names), [int(r) for r in table_rows]
        by_name = {s.name: (i, s) for i, s in enumerate(cfg.sparse)}
        missing = [n for n in self.names if n not in by_name]
        if missing:
            raise ParquetDataError(f"data.parquet.sparse declares no column for feature(s) {missing}; add them")
        self.specs: list[tuple[int, SparseColumnConfig]] = [by_name[n] for n in self.names]
        columns: dict[str, tuple[str, str]] = {}
        for i, c in enumerate(cfg.dense):
            columns[c] = ("dense", f"data.parquet.dense[{i}]")
        for i, s in self.specs:
            columns[s.column or s.name] = (str(s.kind), f"data.parquet.sparse[{i}].column")
            if s.weights:
                list_kind = s.kind in (SparseKind.ids, SparseKind.strings)
                columns[s.weights] = ("weights" if list_kind else "weight", f"data.parquet.sparse[{i}].weights")
        for i, c in enumerate(cfg.labels):
            columns[c] = ("label", f"data.parquet.labels[{i}]")
        if cfg.weight:  # read with the batch's rows (`dlrm.data.parquet.sample_weights`)
            columns[cfg.weight] = ("weight", "data.parquet.weight")
        self.columns = columns  # {column: (kind, the config key that declares it)}
        self.weighted = any(s.weights for _, s in self.specs)
        self.id_dtype = np.int32 if max(self.table_rows) <= _INT32_MAX else np.int64
        self.folded_ids = 0  # ids folded into their table by id_policy=modulo
        self.nonfinite_values = 0  # dense values read as missing by nonfinite=replace
        self.transform = DenseTransform(cfg.dense, cfg.dense_transforms)
        self._magnitude_checked = False
        self._lock = threading.Lock()  # batches are made on several threads (`make_batch` is safe for that)
        scalar = [f for f, (_, s) in enumerate(self.specs) if s.kind == SparseKind.id and not s.weights]
        self._scalar_columns = [self.specs[f][1].column or self.specs[f][1].name for f in scalar]
        self._scalar_rows = np.asarray([self.table_rows[f] for f in scalar], np.int64)
        self._other = {f for f in range(len(self.specs)) if f not in scalar}  # features read one by one
        self._runs = _runs(len(self.specs), scalar)
        self.multi_hot: list[list[int]] | None = None  # per feature, its offsets (data.parquet.multi_hot_sizes)
        self._layouts: dict[tuple[int, torch.device], MultiHotLayout] = {}  # per batch size and device
        if cfg.multi_hot_sizes is not None:
            sizes = [int(m) for m in cfg.multi_hot_sizes]
            if len(sizes) != len(self.names) or min(sizes) < 1 or self._other:
                raise ParquetDataError(
                    f"data.parquet.multi_hot_sizes = {sizes}: give one size >= 1 per feature ({len(self.names)}), "
                    "every feature kind: id without weights"
                )
            from dlrm.data.criteo.loader import multi_hot_offsets

            self.multi_hot = [o.tolist() for o in multi_hot_offsets(sizes, self.table_rows)]

    def _count(self, folded_ids: int = 0, nonfinite_values: int = 0) -> None:
        with self._lock:
            self.folded_ids += folded_ids
            self.nonfinite_values += nonfinite_values

    def prepare(self, table: pa.Table) -> pa.Table:
        """A decoded row group with each string (strings) column replaced by its strings' hashes, int64
        (list<int64>), for `make_batch` to take as they are: hashed once per row group, not per batch.
        A column holding a null keeps its strings (`make_batch` names the row)."""
        hashed = self._hashed_strings(table)
        columns = {self.specs[f][1].column or self.specs[f][1].name: h for f, h in hashed.items()}
        for column, hashes in columns.items():
            arr = _array(table.column(column))
            if pa.types.is_integer(arr.type) or pa.types.is_integer(getattr(arr.type, "value_type", pa.null())):
                continue  # prepared already
            if not pa.types.is_list(arr.type) and not pa.types.is_large_list(arr.type):
                new = pa.array(hashes, pa.int64())
            else:
                offsets = arr.offsets.to_numpy()
                kind = pa.LargeListArray if pa.types.is_large_list(arr.type) else pa.ListArray
                new = kind.from_arrays(pa.array(offsets - offsets[0]), pa.array(hashes, pa.int64()))
            table = table.set_column(table.column_names.index(column), column, new)
        return table

    def make_batch(self, table: pa.Table, origin: list[tuple]) -> Batch:
        """Rows of the declared columns -> Batch; checks the values (nulls, id range, 0/1 labels). The
        dense and label columns and the one-id columns (kind id, unweighted) are read as blocks, checked
        by a few reductions over each; on any bad value `make_batch_by_column` makes (or refuses) the
        batch, naming the value as it always did. The same Batch as `make_batch_by_column` (with
        data.parquet.multi_hot_sizes, its one id per sample and feature expanded: `_expanded`)."""
        blocks = self._blocks(table, origin)
        if blocks is None:
            batch = self.make_batch_by_column(table, origin)
            if self.multi_hot is None:
                return batch
            b = table.num_rows
            ids = batch.sparse_features.values().numpy().reshape(len(self.names), b)  # checked (or folded)
            return self._expanded(batch.dense_features.numpy(), batch.labels.numpy().reshape(b, -1), ids)
        dense, labels, scalar_ids = blocks
        if self.multi_hot is not None:
            return self._expanded(dense, labels, scalar_ids)
        b, rows = table.num_rows, self.table_rows
        if not self._other:  # every feature one id per sample: the block is the values, key-major
            values = scalar_ids.reshape(-1).astype(self.id_dtype, copy=False)
            per_key = [b] * len(self.specs)
            weights = np.ones(len(values), np.float32) if self.weighted else None
            return self._batch(dense, labels, values, np.ones(len(values), np.int32), weights, per_key)
        hashed = self._hashed_strings(table)
        features = {
            f: self._feature(table, origin, i, s, rows[f], hashed.get(f))
            for f, (i, s) in enumerate(self.specs)
            if f in self._other
        }
        per_key = [len(features[f][1]) if f in features else b for f in range(len(self.specs))]
        values = np.empty(sum(per_key), self.id_dtype)
        lengths = np.ones(len(self.specs) * b, np.int32)
        weights = np.ones(len(values), np.float32) if self.weighted else None
        at = 0
        for first, last, row in self._runs:  # features [first, last): block rows from `row`, or one other feature
            if row is not None:
                n = (last - first) * b
                values[at : at + n] = scalar_ids[row : row + last - first].reshape(-1)
            else:
                length, ids, w = features[first]
                n = len(ids)
                values[at : at + n] = ids
                lengths[first * b : last * b] = length
                if w is not None and weights is not None:
                    weights[at : at + n] = w
            at += n
        return self._batch(dense, labels, values, lengths, weights, per_key)

    def _blocks(self, table: pa.Table, origin: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(dense [b, n_dense] float32, labels [b, T] float32, ids [n one-id features, b] of the one-id
        columns), each checked as a block; None if any holds a null (not dense), a label other than 0
        and 1 or an id outside its table."""
        b, columns = table.num_rows, dict(zip(table.column_names, table.columns, strict=True))
        dense = self.dense(table, origin)
        labels = np.empty((b, len(self.cfg.labels)), np.float32)
        for k, c in enumerate(self.cfg.labels):
            arr = _array(columns[c])
            if arr.null_count:
                return None
            labels[:, k] = arr.to_numpy(zero_copy_only=False)
        if ((labels != 0) & (labels != 1)).any():
            return None
        arrays = [_array(columns[c]) for c in self._scalar_columns]
        if any(a.null_count for a in arrays):
            return None
        columns = [a.to_numpy(zero_copy_only=False) for a in arrays]
        dtype = np.result_type(*columns) if columns else np.dtype(np.int64)
        if dtype.kind != "i":  # unsigned (or mixed): int64, after folding in the column's own type
            dtype = np.dtype(np.int64)
        ids = np.empty((len(columns), b), dtype)
        folded = 0
        for k, column in enumerate(columns):
            rows = self._scalar_rows[k]
            if column.size and (column.min() < 0 or column.max() >= rows):
                if self.cfg.id_policy == IdPolicy.refuse:
                    return None  # made column by column, which names the id
                folded += int(((column < 0) | (column >= rows)).sum())
                column = np.mod(column, np.asarray(rows, column.dtype))  # as `_feature` folds: uint64 exact
            ids[k] = column
        self._count(folded_ids=folded)
        return dense, labels, ids

    def dense(self, table: pa.Table, origin: list[tuple]) -> np.ndarray:
        """The dense columns' values, transformed (data.parquet.dense_transforms): [b, width] float32;
        with raw_dense, as read: [b, n_dense] float32, NaN where missing.
        A null is a missing value; a NaN or infinite value (or one beyond float32) is refused naming
        file, column and row, or with data.parquet.nonfinite=replace read as missing and counted
        (`nonfinite_values`). The first batch warns, once, of a column whose inputs reach 1e4 (a first
        loss far from log 2), naming it."""
        b = table.num_rows
        raw = np.empty((len(self.cfg.dense), b), np.float32)  # column by column, then one transpose
        for k, c in enumerate(self.cfg.dense):
            arr = _array(table.column(c))
            with np.errstate(over="ignore", invalid="ignore"):
                raw[k] = arr.to_numpy(zero_copy_only=False)  # nulls: NaN
            if np.isfinite(raw[k]).all():
                continue
            bad = ~np.isfinite(raw[k])
            if arr.null_count:
                bad &= ~arr.is_null().to_numpy(zero_copy_only=False)
            if not bad.any():
                continue
            if self.cfg.nonfinite == NonFinitePolicy.refuse:
                row = int(np.flatnonzero(bad)[0])
                value = arr[row].as_py()
                raise ParquetValueError(
                    f"dense column {c!r} holds {value} at {_where(origin, row)}: not a finite float32; fix the "
                    "value, or set data.parquet.nonfinite=replace to read it as missing (counted)"
                )
            self._count(nonfinite_values=int(bad.sum()))
            raw[k][bad] = np.nan
        if self.raw_dense:  # for a program that transforms them itself (a bundle)
            return np.ascontiguousarray(raw.T)
        out = self.transform.apply(np.ascontiguousarray(raw.T))
        if not self._magnitude_checked and out.size:
            with self._lock:
                first, self._magnitude_checked = not self._magnitude_checked, True
            if not first:
                return out
            top = np.abs(out[:, : len(self.cfg.dense)]).max(axis=0)
            loud = [(c, float(v)) for c, v in zip(self.cfg.dense, top, strict=True) if v >= 1e4]
            if loud:
                c, v = max(loud, key=lambda cv: cv[1])
                log.warning(
                    "dense column %r reaches %.3g as a model input: the first losses will be far from log 2; "
                    "give it a transform (data.parquet.dense_transforms.%s: {log1p: true} and a mean and std; "
                    "python -m dlrm.data.inspect writes them)",
                    c,
                    v,
                    c,
                )
        return out

    def _expanded(self, dense: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Batch | BaseIdBatch:
        """The Batch of base ids [F, b] (one per feature and sample, in range) expanded to
        data.parquet.multi_hot_sizes ids each, as the Criteo source expands its files' ids: here, or
        with `expand_on` when it is moved there (a `BaseIdBatch`, whose base ids are [b, F])."""
        import torch
        from torchrec.datasets.utils import Batch

        from dlrm.data.multihot import BaseIdBatch

        b = ids.shape[1]
        dense_t = torch.from_numpy(dense)
        labels_t = torch.from_numpy(labels[:, 0].copy() if labels.shape[1] == 1 else labels)
        if self.expand_on is not None:
            return BaseIdBatch(dense_t, torch.from_numpy(ids).t(), labels_t, functools.partial(self.layout, b))
        layout = self.layout(b, torch.device("cpu"))
        return Batch(
            dense_features=dense_t, sparse_features=layout.kjt_of_values(layout.expand_host(ids.T)), labels=labels_t
        )

    def layout(self, count: int, device: torch.device) -> MultiHotLayout:
        """The multi-hot layout of `count` samples on `device` (made once per pair)."""
        from dlrm.data.multihot import MultiHotLayout

        assert self.multi_hot is not None
        if (count, device) not in self._layouts:
            self._layouts[count, device] = MultiHotLayout(self.names, self.table_rows, self.multi_hot, count, device)
        return self._layouts[count, device]

    def _batch(
        self,
        dense: np.ndarray,
        labels: np.ndarray,
        values: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray | None,
        per_key: list[int],
    ) -> Batch:
        import torch
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        sparse = KeyedJaggedTensor(
            keys=self.names,
            values=torch.from_numpy(values),
            lengths=torch.from_numpy(lengths),
            weights=torch.from_numpy(weights) if weights is not None else None,
            stride=len(dense),
            length_per_key=per_key,
        )
        return Batch(
            dense_features=torch.from_numpy(dense),
            sparse_features=sparse,
            labels=torch.from_numpy(labels[:, 0].copy() if labels.shape[1] == 1 else labels),
        )

    def make_batch_by_column(self, table: pa.Table, origin: list[tuple]) -> Batch:
        """`make_batch` column by column: each value checked where it is read, the first bad one named
        (file, column, row) in a `ParquetValueError`; ids out of range folded under id_policy=modulo."""
        b = table.num_rows
        dense = self.dense(table, origin)
        labels = np.empty((b, len(self.cfg.labels)), np.float32)
        for k, c in enumerate(self.cfg.labels):
            arr = _array(table.column(c))
            if arr.null_count:
                row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
                raise ParquetValueError(f"label column {c!r} is null at {_where(origin, row)}; labels must be 0 or 1")
            values = arr.cast(pa.float32()).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero((values != 0) & (values != 1))
            if bad.size:
                raise ParquetValueError(
                    f"label column {c!r} holds {values[bad[0]]:g} at {_where(origin, int(bad[0]))}; labels must be "
                    "0 or 1"
                )
            labels[:, k] = values
        lengths, values_, weights = [], [], []
        for (i, spec), rows in zip(self.specs, self.table_rows, strict=True):
            length, ids, w = self._feature(table, origin, i, spec, rows)
            lengths.append(length)
            values_.append(ids)
            if self.weighted:
                weights.append(w if w is not None else np.ones(len(ids), np.float32))
        return self._batch(
            dense,
            labels,
            np.concatenate(values_).astype(self.id_dtype, copy=False),
            np.concatenate(lengths).astype(np.int32),
            np.concatenate(weights) if self.weighted else None,
            [len(v) for v in values_],
        )

    def _hashed_strings(self, table: pa.Table) -> dict[int, np.ndarray]:
        """{feature: hash_strings of its strings}, for the string features without a null string or list
        (the others are hashed, or refused, by `_feature`): one `hash_strings` call for all of them,
        whose passes over the byte positions then cost the same for 26 columns as for one."""
        flats: dict[int, pa.Array] = {}
        done: dict[int, np.ndarray] = {}
        for f, (_, s) in enumerate(self.specs):
            if s.kind not in (SparseKind.string, SparseKind.strings):
                continue
            arr = _array(table.column(s.column or s.name))
            if arr.null_count:
                continue
            flat = arr if s.kind == SparseKind.string else arr.values.slice(arr.offsets[0].as_py(), _list_size(arr))
            if pa.types.is_integer(flat.type):  # hashed already (`prepare`)
                done[f] = flat.to_numpy(zero_copy_only=False)
            elif not flat.null_count:
                flats[f] = flat.cast(pa.large_string())
        if not flats:
            return done
        hashes = hash_strings(pa.concat_arrays(list(flats.values())))
        ends = np.cumsum([len(a) for a in flats.values()])
        return done | dict(zip(flats, np.split(hashes, ends[:-1]), strict=True))

    # long: one sparse feature of every kind (id, ids, string, strings, weights) in one place
    def _feature(
        self,
        table: pa.Table,
        origin: list[tuple],
        i: int,
        spec: SparseColumnConfig,
        rows: int,
        hashed: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One feature's (lengths [b], ids [n] in [0, rows) (an integer dtype), weights [n] float32 or None);
        `hashed`: its strings' hashes, made already (`_hashed_strings`)."""
        column = spec.column or spec.name
        arr = _array(table.column(column))
        is_list = spec.kind in (SparseKind.ids, SparseKind.strings)
        if arr.null_count:
            row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
            raise ParquetValueError(
                f"column {column!r} (data.parquet.sparse[{i}]) is null at {_where(origin, row)}; "
                + ("write an empty list for no ids" if is_list else "give every row an id (or use kind: ids)")
            )
        if is_list:  # no null lists: the ids are the values between the first and last offsets
            offsets = arr.offsets.to_numpy()
            lengths = np.diff(offsets)
            flat = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        else:
            lengths, flat = np.ones(len(arr), np.int64), arr

        def row_of(j: int) -> int:  # the row of the j-th id: for messages only (a cumsum per call)
            return int(np.searchsorted(np.cumsum(lengths), j, side="right"))

        if flat.null_count:
            j = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
            raise ParquetValueError(
                f"column {column!r} (data.parquet.sparse[{i}]) holds a null id at {_where(origin, row_of(j))}; "
                "remove it"
            )
        if spec.kind in (SparseKind.string, SparseKind.strings):
            if hashed is None:  # hashed already (`prepare`: int64), else here
                hashed = flat.to_numpy(zero_copy_only=False) if pa.types.is_integer(flat.type) else hash_strings(flat)
            ids = hashed % rows
        else:
            ids = flat.to_numpy(zero_copy_only=False)  # integers checked as they are, no copy
            if ids.dtype.kind != "i" and ids.dtype != np.uint64:  # uint64 kept: ids beyond int64 stay exact
                ids = ids.astype(np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= rows):  # two reductions, no mask on the good path
                bad = (ids < 0) | (ids >= rows)
                if self.cfg.id_policy == IdPolicy.refuse:
                    j = int(np.flatnonzero(bad)[0])
                    raise ParquetValueError(
                        f"column {column!r} (data.parquet.sparse[{i}]) holds id {ids[j]} at "
                        f"{_where(origin, row_of(j))}, "
                        f"outside its table's [0, {rows}); enlarge the table, remap the ids, or set "
                        "data.parquet.id_policy=modulo"
                    )
                self._count(folded_ids=int(bad.sum()))
                ids = np.mod(ids, np.asarray(rows, ids.dtype)).astype(np.int64, copy=False)
        weights = None
        if spec.weights:
            warr = _array(table.column(spec.weights))
            wflat = warr.flatten() if is_list else warr
            if warr.null_count or wflat.null_count:
                raise ParquetValueError(
                    f"weights column {spec.weights!r} (data.parquet.sparse[{i}].weights) holds nulls; give every "
                    "id a weight"
                )
            if is_list:
                wlengths = compute("list_value_length", warr).to_numpy(zero_copy_only=False)
                bad_rows = np.flatnonzero(wlengths != lengths)
                if bad_rows.size:
                    r = int(bad_rows[0])
                    raise ParquetValueError(
                        f"weights column {spec.weights!r} has {wlengths[r]} weights but {column!r} has {lengths[r]} "
                        "ids "
                        f"at {_where(origin, r)}; give one weight per id"
                    )
            weights = wflat.cast(pa.float32()).to_numpy(zero_copy_only=False)
            if not np.isfinite(weights).all():
                j = int(np.flatnonzero(~np.isfinite(weights))[0])
                raise ParquetValueError(
                    f"weights column {spec.weights!r} (data.parquet.sparse[{i}].weights) holds {weights[j]} at "
                    f"{_where(origin, row_of(j))}: not a finite float32; fix the weight"
                )
        return lengths, ids, weights
