"""The data section: where batches come from (synthetic, preprocessed Criteo, or a team's own Parquet)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from dlrm.config.checks import _fail, _require_count, _require_positive
from dlrm.config.choices import DataSource, IdPolicy, NonFinitePolicy, SparseKind
from dlrm.config.periods import PeriodsConfig


@dataclass
class SyntheticConfig:
    """Criteo-shaped synthetic data: Zipf-distributed ids, labels from a hidden logistic model."""

    zipf_alpha: float = 1.05
    """Power-law exponent of id popularity."""
    signal: float = 2.0
    """Scale of the hidden model's logit (larger: more learnable)."""
    eval_offset: int = 1_000_000_000
    """The eval split's first sample index."""
    on_device: bool = True
    """Make batches on the training device (on CUDA: no host work, no pinning, no copy); false: on the
    host, then pinned and copied as file data is. The numbers are the same either way."""

    def check(self, key: str) -> None:
        _require_positive(f"{key}.zipf_alpha", self.zipf_alpha)


@dataclass
class CriteoConfig:
    """Preprocessed Criteo: the directory that holds the .npy days, and how they are read."""

    dir: str | None = None
    """The --out directory of `dlrm.data.criteo.preprocess` (its manifest.json and .npy days); required with
    data.source=criteo."""
    train_days: list[int] = field(default_factory=list)
    """Days to train on ([] = every day in the manifest that is not in eval_days)."""
    eval_days: list[int] = field(default_factory=list)
    """Days to evaluate on; [] with eval_fraction > 0 holds out the last fraction of the train rows."""
    eval_fraction: float = 0.0
    """With eval_days=[]: the fraction in (0, 1) of the train rows, the last ones, held out for
    evaluation; 0: none."""
    multi_hot_sizes: list[int] | None = None
    """Ids per sample of each sparse column C1..C26 (MLPerf DCNv2 synthesis); None = one-hot."""
    shuffle: bool = True
    """Reshuffle the train batch order each epoch from the seed (eval is read in order)."""
    prefetch_batches: int = 4
    """Batches read ahead (below 1: one)."""
    verify_checksums: bool = True
    """Compare each file's sha256 with manifest.json at start-up (the other checks always run)."""


@dataclass
class SparseColumnConfig:
    """One sparse feature read from a Parquet column."""

    name: str = MISSING
    """The feature's name: one of the model's table features (model.tables[*].features)."""
    column: str | None = None
    """The Parquet column holding its ids; None: the column named `name`."""
    kind: SparseKind = SparseKind.id
    """id: an integer column, one id per sample; ids: list<integer>, any number per sample (empty
    allowed); string: a string column, strings: list<string>, each string hashed into the table
    (`dlrm.data.parquet.hashing.hash_strings`: FNV-1a 64 then splitmix64's finaliser, modulo the rows)."""
    weights: str | None = None
    """A float column (list<float> beside ids/strings, as many per sample) of per-id weights, put in the
    KeyedJaggedTensor's weights, which a weighted model (model.weighted=true) multiplies each id's row
    by; None: 1.0 per id."""


@dataclass
class DenseTransformConfig:
    """How one dense column's raw values become the model's input, in this order: clip to [lo, hi],
    log1p (of max(x, 0)), standardise ((x - mean) / std); a missing value (null, or a non-finite one
    with nonfinite: replace) becomes 0 and, with missing_flag, sets an extra 0/1 input."""

    log1p: bool = False
    """log(1 + max(x, 0)): for non-negative heavy-tailed values (counts, prices)."""
    mean: float = 0.0
    """Subtracted after clip and log1p (the measured mean of the column so far transformed)."""
    std: float = 1.0
    """Divided by after subtracting the mean (> 0)."""
    clip: list[float] | None = None
    """[lo, hi]: raw values clipped to these bounds first; None: not clipped."""
    missing_flag: bool = False
    """Add one 0/1 input after all dense values: 1 where this column's value is missing."""


@dataclass
class ParquetConfig:
    """A team's own Parquet data: which columns are dense features, sparse features and labels."""

    path: str | None = None
    """The train files: a directory (its *.parquet files, recursively), a glob, or a URI
    (file:///..., s3://..., gs://... as pyarrow.fs opens them); required with data.source=parquet."""
    dense: list[str] = field(default_factory=list)
    """Float (or integer) columns of dense features, in the model's input order ([] = none); nulls read as 0."""
    sparse: list[SparseColumnConfig] = field(default_factory=list)
    """The sparse features, one per model table feature."""
    labels: list[str] = field(default_factory=lambda: ["label"])
    """0/1 label columns: one gives labels [B / W], T give [B / W, T]."""
    weight: str | None = None
    """A sample-weight column (finite numbers >= 0; not a feature): each row's loss and its share of
    the evaluation's AUC, log loss, NE and calibration are weighted by it, the loss normalised by the
    global batch's weight sum. None: every row weighs 1 (the unweighted figures)."""
    eval_path: str | None = None
    """The eval files (as `path`); None: hold out eval_fraction of the train row groups."""
    eval_fraction: float = 0.0
    """With eval_path=None: the fraction in [0, 1) of the train row groups, the last ones in file
    order, held out for evaluation; 0: no eval split."""
    shuffle: bool = True
    """Reshuffle the order of the train row groups each epoch from (seed, epoch); eval is read in order."""
    id_policy: IdPolicy = IdPolicy.refuse
    """An id below 0 or >= its table's rows: refuse (one error line naming column, file and row) or
    modulo (folded into the table, and counted)."""
    prefetch_batches: int = 4
    """Batches read ahead by each reader worker (below 1: one)."""
    reader_workers: int = 0
    """Threads that decode row groups and make one rank's batches, handed over in order (the same
    batches for any count); 0: min(4, the node's cores per rank)."""
    multi_hot_sizes: list[int] | None = None
    """Ids per sample of each of the model's features, in table order, from one base id per sample
    (every sparse column kind id, unweighted): id j is (base + offset_j) % rows, the offsets of
    data.criteo.multi_hot_sizes (MLPerf DCNv2's synthesis, `multi_hot_offsets`); None: the ids as stored."""
    dense_transforms: dict[str, DenseTransformConfig] = field(default_factory=dict)
    """Per dense column (a name in `dense`), its transform (`dlrm.data.parquet.transforms`); a column
    not named here is read as it is (nulls as 0). Missing flags widen the model's dense input:
    model.dense_in_features = len(dense) + the flags."""
    nonfinite: NonFinitePolicy = NonFinitePolicy.refuse
    """A NaN or infinite dense value: refuse (one error line naming file, column and row) or replace
    (read as missing: 0, and its flag; counted in the log)."""
    periods: PeriodsConfig = field(default_factory=PeriodsConfig)
    """Time partitions (`periods.key`): the training window and the evaluated periods, read in time order."""

    def dense_width(self) -> int:
        """The model's dense inputs: one per dense column, then one per missing flag."""
        return len(self.dense) + sum(
            1 for c in self.dense if c in self.dense_transforms and self.dense_transforms[c].missing_flag
        )

    def check(self, key: str) -> None:
        if not self.path:
            _fail(f"{key}.path", self.path, "point it at your Parquet files (a directory, a glob or a URI)")
        if not self.sparse:
            _fail(
                f"{key}.sparse", [], "list the sparse features: {name: ..., column: ..., kind: id|ids|string|strings}"
            )
        if not self.labels:
            _fail(f"{key}.labels", [], "name at least one 0/1 label column")
        if not 0 <= self.eval_fraction < 1:
            _fail(f"{key}.eval_fraction", self.eval_fraction, "use a fraction in [0, 1)")
        if self.reader_workers < 0:
            _fail(f"{key}.reader_workers", self.reader_workers, "use 0 (min(4, cores per rank)) or a count >= 1")
        if self.eval_path and self.eval_fraction:
            _fail(f"{key}.eval_fraction", self.eval_fraction, "give eval_path or eval_fraction, not both")
        self.periods.check(f"{key}.periods")
        if self.periods.key and (self.eval_path or self.eval_fraction):
            name = "eval_path" if self.eval_path else "eval_fraction"
            _fail(
                f"{key}.{name}",
                getattr(self, name),
                f"with {key}.periods.key the evaluated periods are {key}.periods.eval: set {name} to null/0",
            )
        self._check_columns(key)
        if self.multi_hot_sizes is not None and self.weight is not None:
            _fail(f"{key}.weight", self.weight, f"not with {key}.multi_hot_sizes: set one of them to null")
        if self.multi_hot_sizes is not None:
            if min(self.multi_hot_sizes, default=0) < 1:
                _fail(f"{key}.multi_hot_sizes", self.multi_hot_sizes, "give one size >= 1 per feature, or null")
            others = [s.name for s in self.sparse if s.kind != SparseKind.id or s.weights]
            if others:
                _fail(
                    f"{key}.multi_hot_sizes",
                    self.multi_hot_sizes,
                    f"it expands one base id per sample: declare every feature kind: id without weights ({others} "
                    "are not), or set it to null",
                )

    def _check_columns(self, key: str) -> None:
        """Unique feature names, one task per label column and no label as an input, transforms of
        declared dense columns."""
        seen: set[str] = set()
        for i, s in enumerate(self.sparse):
            if not s.name or s.name in seen:
                _fail(f"{key}.sparse[{i}].name", s.name, "give each sparse feature a unique, non-empty name")
            seen.add(s.name)
        seen_labels: set[str] = set()
        inputs = {c: f"{key}.dense" for c in self.dense}
        for i, s in enumerate(self.sparse):
            inputs[s.column or s.name] = f"{key}.sparse[{i}]"
            if s.weights:
                inputs[s.weights] = f"{key}.sparse[{i}].weights"
        for i, label in enumerate(self.labels):
            if label in seen_labels:
                _fail(f"{key}.labels[{i}]", label, "one label column feeds one task: name each label column once")
            seen_labels.add(label)
            if label == self.weight:
                _fail(f"{key}.weight", self.weight, f"it is also a label ({key}.labels[{i}]); name another column")
            if label in inputs:
                _fail(
                    f"{key}.labels[{i}]",
                    label,
                    f"it is also an input ({inputs[label]}): the model would read its answer; remove it there",
                )
        if self.weight is not None and self.weight in inputs:
            _fail(
                f"{key}.weight", self.weight, f"it is also an input ({inputs[self.weight]}); a weight is not a feature"
            )
        for column, t in self.dense_transforms.items():
            where = f"{key}.dense_transforms.{column}"
            if column not in self.dense:
                _fail(where, column, f"name a column of {key}.dense {list(self.dense)}, or remove the entry")
            if not t.std > 0 or t.std != t.std or abs(t.mean) == float("inf") or t.mean != t.mean:
                _fail(f"{where}.std", t.std, "give a finite mean and a std > 0")
            if t.clip is not None and (len(t.clip) != 2 or not t.clip[0] <= t.clip[1]):
                _fail(f"{where}.clip", list(t.clip), "give [lo, hi] with lo <= hi, or null")


@dataclass
class DataConfig:
    """Where batches come from. The global batch at step k is the same for any world size."""

    source: DataSource = DataSource.synthetic
    """synthetic (data.synthetic), criteo (preprocessed files, data.criteo) or parquet (your own
    Parquet files, data.parquet)."""
    global_batch_size: int = 512
    """Samples per step over all ranks; each rank takes an equal slice, so the world size divides it."""
    eval_batches: int = 16
    """Global batches of the eval split scored at each evaluation (0: none; fewer if the split holds
    fewer)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """The synthetic data, with source=synthetic."""
    criteo: CriteoConfig = field(default_factory=CriteoConfig)
    """The preprocessed Criteo files, with source=criteo."""
    parquet: ParquetConfig = field(default_factory=ParquetConfig)
    """Your own Parquet files, with source=parquet."""

    def check(self, key: str = "data") -> None:
        _require_positive(f"{key}.global_batch_size", self.global_batch_size)
        _require_count(f"{key}.eval_batches", self.eval_batches, "no evaluation")
        if self.source == DataSource.synthetic:
            self.synthetic.check(f"{key}.synthetic")
        if self.source == DataSource.parquet:
            self.parquet.check(f"{key}.parquet")
            if self.eval_batches == 0 and (self.parquet.eval_path or self.parquet.eval_fraction):
                _fail(
                    f"{key}.eval_batches",
                    0,
                    "an eval split is given (data.parquet.eval_path or eval_fraction) but never read: set "
                    f"{key}.eval_batches > 0, or remove the split",
                )
