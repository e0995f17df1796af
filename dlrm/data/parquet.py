# long file: the Parquet source is one concept: schema checks, row-group slicing, KJT building
"""A team's own Parquet data as batches (`data.source=parquet`, `data.parquet`): declared dense, sparse
and label columns, the same global batches on any world size.

The files of a split (sorted by path) are a sequence of row groups; each epoch of the train split
orders its row groups by a permutation seeded by (seed, epoch) (`data.parquet.shuffle`; rows inside a
row group keep their order), eval reads them in file order, one pass. Global batch k is rows
[k * B, (k + 1) * B) of that sequence (the last partial batch is dropped); rank r of W takes rows
[k * B + r * b, k * B + (r + 1) * b), b = B / W. `batches(..., start_step=k)` starts at batch k exactly.

A rank reads (`ParquetFile.read_row_group`, only the declared columns, local files memory-mapped)
just the row groups that overlap its slices, and keeps the last few decoded, so read amplification
is small when row groups hold about b rows or fewer: with G rows per row group a rank decodes at
most b + G rows per step for the b it uses ((b + G) / b), and about once each over consecutive
steps. With G much larger than B every rank decodes every row group (amplification W): write row
groups of about B / W rows or less (`python -m dlrm.data.convert --row-group-size`).

Sparse columns (`data.parquet.sparse[*].kind`): id (an integer column), ids (list<integer>: any
number per sample, empty allowed), string and strings (string / list<string>, hashed:
`hash_strings`). The KeyedJaggedTensor's keys are the model's features in table order, its values
key-major, built from Arrow's offsets and values with numpy; the one-id columns (kind id,
unweighted), the dense and the label columns as blocks (`make_batch`), column by column where a
batch holds a bad value. Ids below 0 or >= the table's rows are refused (one line naming column,
file and row) or, with id_policy=modulo, folded into the table and counted (`folded_ids`). With
data.parquet.multi_hot_sizes, every column holds one base id per sample, expanded as the Criteo
source expands its files' (`dlrm.data.multihot`, `multi_hot_offsets`).

Checks: the schemas of every file from Parquet metadata at start-up (missing column, wrong type, a
list where a scalar is declared or the reverse, schemas differing between files, an empty or
unreadable file); then, from the row groups' statistics in the same metadata, nulls, ids out of
range and labels below 0 or above 1 in one-id and label columns (a row group the statistics flag is
read to name the row); each batch's values as it is read (all of these, in list columns too, and
labels other than 0 and 1, also in files written without statistics). Each failure is a
`ParquetDataError`: one line, exit 2. Files are untrusted: reading Parquet runs no code from them.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dlrm.config import ParquetConfig, SparseColumnConfig
from dlrm.config.choices import IdPolicy, SparseKind
from dlrm.data.prefetch import Prefetcher
from dlrm.errors import UserError

if TYPE_CHECKING:  # torch and torchrec where batches are made: the hash and the checks start without them
    from torchrec.datasets.utils import Batch

    from dlrm.data.multihot import MultiHotLayout

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")
_GLOB = set("*?[")
_INT32_MAX = 2**31 - 1
_CACHED_ROW_GROUPS = 4  # decoded row groups a reader keeps (consecutive slices share them)

# The string hash: FNV-1a 64 over the UTF-8 bytes, then splitmix64's finaliser (FNV's low bits mix
# poorly), the top bit cleared; id = hash % rows. Fixed constants: the same id on every rank, machine, run.
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_LOW63 = np.uint64(2**63 - 1)


def compute(name: str, *args, options=None):
    """pyarrow.compute's function `name` (its module attributes are made at import: type checkers miss them)."""
    return pc.call_function(name, list(args), options)


class ParquetDataError(UserError):
    """Parquet files that do not fit data.parquet: the message names the file, the column and the fix."""

    same_on_all_ranks = True  # every rank checks the same files' metadata at start-up


class ParquetValueError(ParquetDataError):
    """A bad value in the rows one rank reads (null, id out of range, label not 0/1)."""

    same_on_all_ranks = False  # each rank reads its own rows


def hash_strings(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Stable 63-bit hashes (int64 [n], >= 0) of non-null strings: FNV-1a 64 of each string's UTF-8
    bytes, then splitmix64's finaliser, top bit cleared. Vectorised over strings, one pass per byte
    position (strings sorted by length, so each pass touches only the strings that long)."""
    arr = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.int64)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n + 1]
    data_buffer = arr.buffers()[2]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")
    starts, longest_first = offsets[:-1][order], lengths[order]
    h = np.full(n, _FNV_OFFSET, np.uint64)
    for j in range(int(longest_first[0]) if n else 0):
        k = int(np.searchsorted(-longest_first, -j, side="left"))  # strings longer than j
        h[:k] ^= data[starts[:k] + j].astype(np.uint64)
        h[:k] *= _FNV_PRIME
    h ^= h >> np.uint64(30)
    h *= _MIX1
    h ^= h >> np.uint64(27)
    h *= _MIX2
    h ^= h >> np.uint64(31)
    out = np.empty(n, np.int64)
    out[order] = (h & _LOW63).astype(np.int64)
    return out


def write_options(schema: pa.Schema, compression: str = "snappy") -> dict:
    """`pq.write_table` / `pq.ParquetWriter` keyword arguments of the layout this source decodes fastest
    (`dlrm.data.convert` and `dlrm.bench.batches` write it): numbers PLAIN-encoded, dictionary encoding
    for string columns only, `compression` (snappy, lz4, zstd or none). Ids of large tables rarely
    repeat within a row group, and Arrow decodes a dictionary-encoded integer column (dictionary,
    indexes, gather) about twice as slowly as a plain one. Files of any encoding are read alike."""
    strings = []
    for f in schema:
        is_list = pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        t = f.type.value_type if is_list else f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            strings.append(f"{f.name}.list.element" if is_list else f.name)  # the Parquet leaf's path
    return {"use_dictionary": strings, "compression": compression}


@dataclass(frozen=True)
class RowGroup:
    """Row group `index` of file `file` (an index into the dataset's files): `rows` rows, the first
    being row `first_row` of the file."""

    file: int
    index: int
    rows: int
    first_row: int


def list_files(uri: str, key: str) -> tuple[pafs.FileSystem, list[str]]:
    """(filesystem, sorted file paths) of a directory (its *.parquet, recursively), a glob or one file;
    local paths or URIs that pyarrow.fs opens (file://, s3://, gs://, hdfs://)."""
    glob_at = min((i for i, c in enumerate(uri) if c in _GLOB), default=None)
    cut = len(uri) if glob_at is None else uri.rfind("/", 0, glob_at) + 1
    base_uri, rest = uri[:cut] or ".", uri[cut:]  # the directory above the first glob character, the pattern
    try:
        if "://" in base_uri:
            fs, base = pafs.FileSystem.from_uri(base_uri)
        else:
            fs, base = pafs.LocalFileSystem(), os.path.abspath(base_uri)
        if glob_at is not None:
            pattern = base.rstrip("/") + "/" + rest
            infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
            files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, pattern)]
        else:
            info = fs.get_file_info(base)
            if info.type == pafs.FileType.NotFound:
                raise ParquetDataError(f"{key} = {uri!r}: no such file or directory; point it at your Parquet files")
            if info.type == pafs.FileType.File:
                files = [base]
            else:
                infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
                files = [
                    i.path
                    for i in infos
                    if i.type == pafs.FileType.File
                    and i.path.endswith(".parquet")
                    and not any(p.startswith((".", "_")) for p in i.path[len(base) :].split("/"))
                ]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise ParquetDataError(
            f"{key} = {uri!r} cannot be opened ({str(e).splitlines()[0]}); fix the path or URI"
        ) from None
    if not files:
        raise ParquetDataError(f"{key} = {uri!r} holds no Parquet files (*.parquet); write some there or fix the path")
    return fs, sorted(files)


def _type_problem(t: pa.DataType, kind: str) -> str | None:
    """Why Arrow type `t` cannot be read as `kind` (dense, label, id, ids, string, strings, weight,
    weights), with the fix; None if it can."""
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    inner = t.value_type if is_list else None
    is_str = pa.types.is_string(t) or pa.types.is_large_string(t)
    number = pa.types.is_integer(t) or pa.types.is_floating(t)
    if kind in ("dense", "weight"):
        return None if number else f"is {t}, not a number column" + ("; a list column is not dense" if is_list else "")
    if kind == "label":
        return None if number or pa.types.is_boolean(t) else f"is {t}, not a 0/1 label column"
    if kind == "weights":
        return (
            None
            if is_list and (pa.types.is_floating(inner) or pa.types.is_integer(inner))
            else f"is {t}, not list<float>"
        )
    ok = {
        "id": pa.types.is_integer(t),
        "ids": is_list and pa.types.is_integer(inner),
        "string": is_str,
        "strings": is_list and (pa.types.is_string(inner) or pa.types.is_large_string(inner)),
    }[kind]
    if ok:
        return None
    actual = next(
        (
            k
            for k, fits in (
                ("id", pa.types.is_integer(t)),
                ("ids", is_list and inner is not None and pa.types.is_integer(inner)),
                ("string", is_str),
                (
                    "strings",
                    is_list and inner is not None and (pa.types.is_string(inner) or pa.types.is_large_string(inner)),
                ),
            )
            if fits
        ),
        None,
    )
    return f"is {t}, declared kind {kind}" + (f": declare kind: {actual}" if actual else "")


class _Dataset:
    """The files of one split: their metadata, checked against the declared columns, and row groups."""

    def __init__(self, uri: str, key: str, columns: dict[str, tuple[str, str]]):
        """columns: {column: (kind as `_type_problem` takes it, the config key that declares it)}."""
        self.fs, self.paths = list_files(uri, key)
        self.metadata: list[pq.FileMetaData] = []
        self.row_groups: list[RowGroup] = []
        self.types: dict[str, pa.DataType] = {}
        for i, path in enumerate(self.paths):
            try:
                with self.fs.open_input_file(path) as f:
                    parquet = pq.ParquetFile(f)
                    md, schema = parquet.metadata, parquet.schema_arrow
            except (pa.ArrowException, OSError) as e:
                raise ParquetDataError(
                    f"{path} is not a readable Parquet file ({str(e).splitlines()[0]}): truncated or another "
                    "format; rewrite it (python -m dlrm.data.convert) or remove it"
                ) from None
            if md.num_rows == 0:
                raise ParquetDataError(f"{path} has no rows; remove it or write rows to it")
            for column, (kind, ckey) in columns.items():
                if column not in schema.names:
                    raise ParquetDataError(
                        f"{path} has no column {column!r} ({ckey}); its columns are {schema.names}: fix {ckey}"
                    )
                t = schema.field(column).type
                problem = _type_problem(t, kind)
                if problem:
                    raise ParquetDataError(f"column {column!r} ({ckey}) of {path} {problem}")
                if column in self.types and self.types[column] != t:
                    raise ParquetDataError(
                        f"column {column!r} is {self.types[column]} in {self.paths[0]} but {t} in {path}: the "
                        "files' schemas differ; rewrite them with one schema"
                    )
                self.types.setdefault(column, t)
            first = 0
            for g in range(md.num_row_groups):
                rows = md.row_group(g).num_rows
                if rows:
                    self.row_groups.append(RowGroup(i, g, rows, first))
                first += rows
            self.metadata.append(md)


class _Split:
    """A split's row groups (indexes into its dataset's) and, per epoch, their order."""

    def __init__(self, dataset: _Dataset, groups: list[int]):
        self.dataset, self.groups = dataset, groups
        self.rows = sum(dataset.row_groups[g].rows for g in groups)


class _Reader:
    """Reads rows of a split's ordered row groups, keeping the last few row groups decoded (one per
    generator: a ParquetFile is not shared between threads)."""

    def __init__(self, dataset: _Dataset, columns: list[str]):
        self.dataset, self.columns = dataset, columns
        self.files: dict[int, pq.ParquetFile] = {}
        self.cache: OrderedDict[int, pa.Table] = OrderedDict()

    def group(self, g: int) -> pa.Table:
        if g in self.cache:
            self.cache.move_to_end(g)
            return self.cache[g]
        rg = self.dataset.row_groups[g]
        if rg.file not in self.files:
            path = self.dataset.paths[rg.file]
            local = isinstance(self.dataset.fs, pafs.LocalFileSystem)  # memory-mapped: no copy out of the page cache
            handle = pa.memory_map(path) if local else self.dataset.fs.open_input_file(path)
            self.files[rg.file] = pq.ParquetFile(handle, metadata=self.dataset.metadata[rg.file])
        try:
            table = self.files[rg.file].read_row_group(rg.index, columns=self.columns)
        except (pa.ArrowException, OSError) as e:
            raise ParquetValueError(
                f"{self.dataset.paths[rg.file]}: row group {rg.index} cannot be read ({str(e).splitlines()[0]}); "
                "rewrite or remove the file"
            ) from None
        self.cache[g] = table
        while len(self.cache) > _CACHED_ROW_GROUPS:
            self.cache.popitem(last=False)
        return table

    def read(self, order: list[int], starts: np.ndarray, start: int, count: int) -> tuple[pa.Table, list[tuple]]:
        """Rows [start, start + count) of the row groups `order` (starts: their first rows), and where
        they come from: [(first row in the batch, file path, first row in the file), ...]."""
        pieces, origin, at = [], [], 0
        i = int(np.searchsorted(starts, start, side="right")) - 1
        while count > 0:
            rg = self.dataset.row_groups[order[i]]
            a = start - int(starts[i])
            n = min(count, rg.rows - a)
            pieces.append(self.group(order[i]).slice(a, n))
            origin.append((at, self.dataset.paths[rg.file], rg.first_row + a))
            start, count, at, i = start + n, count - n, at + n, i + 1
        return pa.concat_tables(pieces).combine_chunks(), origin


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


class ParquetSource:
    """Batches of a team's Parquet files for one rank: `Batch(dense [b, n_dense] f32, sparse KJT with
    real lengths (and weights when declared), labels [b] f32, or [b, T] with T label columns)`.

    feature_names: the model's sparse features in KJT key order; table_rows: the rows of each one's
    table. Example: `ParquetSource(cfg.data.parquet, names, rows, 2048, seed=0).batches("train", rank, world)`.
    """

    # long: opens both splits and checks their schemas before any batch is read
    def __init__(
        self,
        cfg: ParquetConfig,
        feature_names: Sequence[str],
        table_rows: Sequence[int],
        global_batch_size: int,
        seed: int,
    ):
        if not cfg.path:
            raise ParquetDataError("data.parquet.path is not set: point it at your Parquet files")
        self.cfg, self.seed, self.global_batch_size = cfg, int(seed), int(global_batch_size)
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
        self.columns = list(columns)
        self.weighted = any(s.weights for _, s in self.specs)
        self.id_dtype = np.int32 if max(self.table_rows) <= _INT32_MAX else np.int64
        self.folded_ids = 0  # ids folded into their table by id_policy=modulo
        scalar = [f for f, (_, s) in enumerate(self.specs) if s.kind == SparseKind.id and not s.weights]
        self._scalar_columns = [self.specs[f][1].column or self.specs[f][1].name for f in scalar]
        self._scalar_rows = np.asarray([self.table_rows[f] for f in scalar], np.int64)
        self._other = {f for f in range(len(self.specs)) if f not in scalar}  # features read one by one
        self._runs = _runs(len(self.specs), scalar)
        self.multi_hot: list[list[int]] | None = None  # per feature, its offsets (data.parquet.multi_hot_sizes)
        self._layouts: dict[int, MultiHotLayout] = {}  # per batch size
        if cfg.multi_hot_sizes is not None:
            sizes = [int(m) for m in cfg.multi_hot_sizes]
            if len(sizes) != len(self.names) or min(sizes) < 1 or self._other:
                raise ParquetDataError(
                    f"data.parquet.multi_hot_sizes = {sizes}: give one size >= 1 per feature ({len(self.names)}), "
                    "every feature kind: id without weights"
                )
            from dlrm.data.criteo.loader import multi_hot_offsets

            self.multi_hot = [o.tolist() for o in multi_hot_offsets(sizes, self.table_rows)]

        train = _Dataset(cfg.path, "data.parquet.path", columns)
        groups = list(range(len(train.row_groups)))
        if cfg.eval_path:
            evals = _Dataset(cfg.eval_path, "data.parquet.eval_path", columns)
            for column, t in evals.types.items():
                if train.types[column] != t:
                    raise ParquetDataError(
                        f"column {column!r} is {train.types[column]} in {train.paths[0]} but {t} in "
                        f"{evals.paths[0]} (data.parquet.eval_path): the files' schemas differ; rewrite them with one "
                        "schema"
                    )
            self.splits = {"train": _Split(train, groups), "eval": _Split(evals, list(range(len(evals.row_groups))))}
        else:
            held = max(1, round(len(groups) * cfg.eval_fraction)) if cfg.eval_fraction > 0 else 0
            if held >= len(groups):
                raise ParquetDataError(
                    f"data.parquet.eval_fraction = {cfg.eval_fraction} holds out all {len(groups)} row group(s) of "
                    f"{cfg.path}; lower it, give data.parquet.eval_path, or write smaller row groups"
                )
            cut = len(groups) - held
            self.splits = {"train": _Split(train, groups[:cut]), "eval": _Split(train, groups[cut:])}
        if self.splits["train"].rows < self.global_batch_size:
            raise ParquetDataError(
                f"the train split of {cfg.path} has {self.splits['train'].rows} rows, less than one global batch "
                f"of {self.global_batch_size}; lower data.global_batch_size or add rows"
            )

        for dataset in {id(d.dataset): d.dataset for d in self.splits.values()}.values():
            self._check_statistics(dataset)

    def _check_statistics(self, dataset: _Dataset) -> None:
        """Read (and check as a batch, `make_batch`) each row group whose Parquet statistics show nulls,
        ids outside [0, rows) (id_policy=refuse) or labels outside [0, 1] in a one-id or label column."""
        bounds = {c: (0, 1) for c in self.cfg.labels}
        if self.cfg.id_policy == IdPolicy.refuse:
            bounds |= {s.column or s.name: (0, r - 1) for (_, s), r in zip(self.specs, self.table_rows, strict=True)}
        checked = {s.column or s.name for _, s in self.specs if s.kind == SparseKind.id} | set(self.cfg.labels)
        reader = _Reader(dataset, self.columns)
        for g, rg in enumerate(dataset.row_groups):
            meta = dataset.metadata[rg.file].row_group(rg.index)
            for j in range(meta.num_columns):
                chunk = meta.column(j)
                stats = chunk.statistics
                if chunk.path_in_schema not in checked or stats is None:
                    continue
                lo, hi = bounds.get(chunk.path_in_schema, (None, None))
                nulls = stats.has_null_count and stats.null_count > 0
                outside = stats.has_min_max and lo is not None and (stats.min < lo or stats.max > hi)
                if nulls or outside:
                    self.make_batch(reader.group(g), [(0, dataset.paths[rg.file], rg.first_row)])  # names the row

    def num_batches(self, split: str) -> int:
        """Global batches per epoch of `split` (train or eval); the last partial batch is dropped."""
        if split not in SPLITS:
            raise ValueError(f"split {split!r}: use one of {SPLITS}")
        return self.splits[split].rows // self.global_batch_size

    def group_order(self, split: str, epoch: int) -> list[int]:
        """The split's row groups in the order of `epoch`: seeded by (seed, epoch) for shuffled train."""
        groups = self.splits[split].groups
        if split == "train" and self.cfg.shuffle:
            return [groups[i] for i in np.random.default_rng([self.seed, epoch]).permutation(len(groups))]
        return list(groups)

    def batches(self, split: str, rank: int, world_size: int, start_step: int = 0) -> Prefetcher[Batch]:
        """This rank's slices of global batches start_step, start_step + 1, ... (train: endless; eval: one
        pass), made on a background thread."""
        self.num_batches(split)  # checks the split's name
        if self.global_batch_size % world_size or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank} of world size {world_size}: data.global_batch_size={self.global_batch_size} "
                f"must be divisible by the world size, and 0 <= rank < world size"
            )
        return Prefetcher(self._produce(split, rank, world_size, start_step), max(1, self.cfg.prefetch_batches))

    def rows_in_order(self, batch_size: int, max_rows: int | None = None) -> Iterator[Batch]:
        """Every row of the train split (or its first `max_rows`) in file order, `batch_size` at a time,
        the last batch partial; checked as training's batches are (the scorer's read: dlrm.predict)."""
        split = self.splits["train"]
        n = split.rows if max_rows is None else min(max_rows, split.rows)
        reader = _Reader(split.dataset, self.columns)
        starts = np.concatenate([[0], np.cumsum([split.dataset.row_groups[g].rows for g in split.groups])])
        for start in range(0, n, batch_size):
            yield self.make_batch(*reader.read(split.groups, starts, start, min(batch_size, n - start)))

    # long: one global batch per pass: its row groups, the slice, the checks, the KJT
    def _produce(self, split: str, rank: int, world_size: int, start_step: int) -> Iterator[Batch]:
        n = self.num_batches(split)
        if n == 0:
            return
        b = self.global_batch_size // world_size
        reader = _Reader(self.splits[split].dataset, self.columns)
        step, epoch = start_step, -1
        order, starts = [], np.zeros(1, np.int64)
        while split == "train" or step < n:
            e, j = divmod(step, n)
            if e != epoch:
                epoch, order = e, self.group_order(split, e)
                rows = [self.splits[split].dataset.row_groups[g].rows for g in order]
                starts = np.concatenate([[0], np.cumsum(rows)])
            yield self.make_batch(*reader.read(order, starts, j * self.global_batch_size + rank * b, b))
            step += 1

    def make_batch(self, table: pa.Table, origin: list[tuple]) -> Batch:
        """Rows of the declared columns -> Batch; checks the values (nulls, id range, 0/1 labels). The
        dense and label columns and the one-id columns (kind id, unweighted) are read as blocks, checked
        by a few reductions over each; on any bad value `make_batch_by_column` makes (or refuses) the
        batch, naming the value as it always did. The same Batch as `make_batch_by_column` (with
        data.parquet.multi_hot_sizes, its one id per sample and feature expanded: `_expanded`)."""
        blocks = self._blocks(table)
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

    def _blocks(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(dense [b, n_dense] float32, labels [b, T] float32, ids [n one-id features, b] of the one-id
        columns), each checked as a block; None if any holds a null (not dense), a label other than 0
        and 1 or an id outside its table."""
        b, columns = table.num_rows, dict(zip(table.column_names, table.columns, strict=True))
        dense = np.empty((len(self.cfg.dense), b), np.float32)  # column by column, then one transpose
        for k, c in enumerate(self.cfg.dense):
            arr = _array(columns[c])
            dense[k] = (pc.fill_null(arr, 0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
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
        if dtype.kind != "i":  # unsigned: compared as int64, as `make_batch_by_column` does
            dtype = np.dtype(np.int64)
        ids = np.empty((len(columns), b), dtype)
        for k, column in enumerate(columns):
            ids[k] = column
        if ids.size and (ids.min() < 0 or (ids.max(axis=1) >= self._scalar_rows).any()):
            return None
        return np.ascontiguousarray(dense.T), labels, ids

    def _expanded(self, dense: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Batch:
        """The Batch of base ids [F, b] (one per feature and sample, in range) expanded to
        data.parquet.multi_hot_sizes ids each, as the Criteo source expands its files' ids."""
        import torch
        from torchrec.datasets.utils import Batch

        assert self.multi_hot is not None
        b = ids.shape[1]
        if b not in self._layouts:
            from dlrm.data.multihot import MultiHotLayout

            self._layouts[b] = MultiHotLayout(self.names, self.table_rows, self.multi_hot, b, torch.device("cpu"))
        layout = self._layouts[b]
        return Batch(
            dense_features=torch.from_numpy(dense),
            sparse_features=layout.kjt_of_values(layout.expand_host(ids.T)),
            labels=torch.from_numpy(labels[:, 0].copy() if labels.shape[1] == 1 else labels),
        )

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
        dense = np.empty((b, len(self.cfg.dense)), np.float32)
        for k, c in enumerate(self.cfg.dense):
            dense[:, k] = pc.fill_null(_array(table.column(c)), 0).to_numpy(zero_copy_only=False)
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
        for f, (_, s) in enumerate(self.specs):
            if s.kind not in (SparseKind.string, SparseKind.strings):
                continue
            arr = _array(table.column(s.column or s.name))
            if arr.null_count:
                continue
            flat = arr if s.kind == SparseKind.string else arr.values.slice(arr.offsets[0].as_py(), _list_size(arr))
            if not flat.null_count:
                flats[f] = flat.cast(pa.large_string())
        if not flats:
            return {}
        hashes = hash_strings(pa.concat_arrays(list(flats.values())))
        ends = np.cumsum([len(a) for a in flats.values()])
        return dict(zip(flats, np.split(hashes, ends[:-1]), strict=True))

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
            ids = (hash_strings(flat) if hashed is None else hashed) % rows
        else:
            ids = flat.to_numpy(zero_copy_only=False)  # signed integers checked as they are, no copy
            if ids.dtype.kind != "i":
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
                self.folded_ids += int(bad.sum())
                ids = np.mod(ids.astype(np.int64, copy=False), rows)
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
        return lengths, ids, weights
