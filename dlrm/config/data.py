"""The data section: where batches come from (synthetic or preprocessed Criteo)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm.config.choices import DataSource
from dlrm.config.errors import _require_count, _require_positive


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
    """Preprocessed Criteo (see `dlrm.data.criteo.preprocess`): the directory that holds the .npy days."""

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
class DataConfig:
    """Where batches come from. The global batch at step k is the same for any world size."""

    source: DataSource = DataSource.synthetic
    """synthetic (data.synthetic) or criteo (preprocessed files, data.criteo)."""
    global_batch_size: int = 512
    """Samples per step over all ranks; each rank takes an equal slice, so the world size divides it."""
    eval_batches: int = 16
    """Global batches of the eval split scored at each evaluation (0: none; fewer if the split holds
    fewer)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """The synthetic data, with source=synthetic."""
    criteo: CriteoConfig = field(default_factory=CriteoConfig)
    """The preprocessed Criteo files, with source=criteo."""

    def check(self, key: str = "data") -> None:
        _require_positive(f"{key}.global_batch_size", self.global_batch_size)
        _require_count(f"{key}.eval_batches", self.eval_batches, "no evaluation")
        if self.source == DataSource.synthetic:
            self.synthetic.check(f"{key}.synthetic")
