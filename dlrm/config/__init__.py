"""Typed configuration: dataclass schemas registered in Hydra's ConfigStore, and validation.

The schemas are the one source of defaults (the default options in conf/ restate none of them),
one module per section (`model`, `data`, `topology`, `sharding`, `optim`, `trainer`, `checkpoint`, `run`), each
field documented beside it. Choices are enums, so Hydra refuses a misspelt key, a wrongly typed
value or a value outside its choices while composing (`compose`). Each section's `check` then
tests what types cannot express (sizes, names, consistency) next to its fields, and `Config.check`
what spans sections; a ConfigError names the key, the bad value and the fix, before any process
group exists. The package imports neither torch nor torchrec: the command line's errors come first.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import cast

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from dlrm.config.checkpoint import CheckpointConfig
from dlrm.config.checks import ConfigError, _fail
from dlrm.config.choices import DataSource, DenseSync, Device, EmbeddingOptimizer, PoolingType, Precision, ShardingType
from dlrm.config.data import (
    CriteoConfig,
    DataConfig,
    DenseTransformConfig,
    ParquetConfig,
    SparseColumnConfig,
    SyntheticConfig,
)
from dlrm.config.deltas import DeltasConfig
from dlrm.config.model import ModelConfig, TableConfig, TaskConfig, VocabularyConfig
from dlrm.config.optim import DenseOptimConfig, EmbeddingOptimConfig, OptimConfig, ScheduleConfig
from dlrm.config.periods import PeriodsConfig
from dlrm.config.run import RunConfig
from dlrm.config.sharding import ShardingConfig
from dlrm.config.topology import CollectiveLinkConfig, LinkConfig, TopologyConfig
from dlrm.config.trainer import TrainerConfig

__all__ = [
    "ROW_SPLIT",
    "CheckpointConfig",
    "CollectiveLinkConfig",
    "Config",
    "ConfigError",
    "CriteoConfig",
    "DataConfig",
    "DeltasConfig",
    "DenseOptimConfig",
    "EmbeddingOptimConfig",
    "LinkConfig",
    "ModelConfig",
    "OptimConfig",
    "ParquetConfig",
    "DenseTransformConfig",
    "PeriodsConfig",
    "RunConfig",
    "ScheduleConfig",
    "ShardingConfig",
    "SparseColumnConfig",
    "SyntheticConfig",
    "TableConfig",
    "VocabularyConfig",
    "TaskConfig",
    "TopologyConfig",
    "TrainerConfig",
    "register_configs",
    "to_config",
    "validate",
    "validate_world",
]


# Shardings that split a table's rows across ranks: TorchRec pools a mean table's bag there with a
# division of the whole collection's output (its ShardedEmbeddingBagCollection's mean-pooling callback),
# which also divides the features of tables sharded otherwise by their bag sizes.
ROW_SPLIT = (ShardingType.row_wise, ShardingType.table_row_wise, ShardingType.grid_shard)


@dataclass
class Config:
    """The whole job. Its defaults are the default job (training without overrides) but for
    model.tables, which model=dlrm_small fills; conf/ holds only what other options change."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The network: layer sizes, interaction, embedding tables (conf/model)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where batches come from, and the global batch size (conf/data)."""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """Nodes, ranks, device and links (conf/topology)."""
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    """How the tables are sharded, their kernel and wire precision (conf/sharding)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizers and learning-rate schedule (conf/optim)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """The training loop (conf/trainer)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Distributed checkpoints."""
    deltas: DeltasConfig = field(default_factory=DeltasConfig)
    """Deltas of the changed rows for serving (dlrm.deltas)."""
    run: RunConfig = field(default_factory=RunConfig)
    """The run's name (its directory)."""
    seed: int = 0
    """Seeds the initial weights (per parameter name, the same on any topology), the synthetic data and
    Criteo's train order."""

    def sha256(self) -> str:
        """The SHA-256 hex digest of the whole config (its fields as JSON, keys sorted)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()

    def check(self) -> None:
        """Each section's own checks, then those across sections; ConfigError on the first problem."""
        self.model.check()
        self.data.check()
        self.topology.check()
        self.sharding.check([t.name for t in self.model.tables])
        self.sharding.check_device(str(self.topology.device), self.trainer.pipeline)
        self.optim.check()
        self.trainer.check()
        self.checkpoint.check()
        self.deltas.check()
        self.run.check()
        self._check_source()
        for i, t in enumerate(self.model.tables):
            if t.pooling_type == PoolingType.mean and self.sharding.pinned(t) in ROW_SPLIT:
                _fail(
                    f"model.tables[{i}].pooling_type",
                    "mean",
                    f"table {t.name} is sharded {self.sharding.pinned(t)}, and TorchRec's mean over a bag split by "
                    "rows divides every other multi-id feature of the model too; shard it table_wise, column_wise, "
                    f"table_column_wise or data_parallel (+sharding.per_table.{t.name}=table_wise), or use "
                    "pooling_type=sum",
                )
        self._check_over_time()
        period = self.trainer.sync_period
        if self.trainer.dense_sync == DenseSync.local_sgd and self.checkpoint.every_steps % period:
            _fail(
                "checkpoint.every_steps",
                self.checkpoint.every_steps,
                f"with local SGD the ranks' dense weights agree only at averaging steps: use a multiple of "
                f"trainer.sync_period={period}",
            )
        self._check_precisions()
        if self.optim.embedding.name == EmbeddingOptimizer.adam and self.topology.device == Device.cpu:
            sharded = [t.name for t in self.model.tables if self.sharding.pinned(t) != ShardingType.data_parallel]
            if sharded:
                _fail(
                    "optim.embedding.name",
                    "adam",
                    f"fbgemm's CPU kernels for sharded tables run sgd, adagrad and rowwise_adagrad only, and "
                    f"table(s) {', '.join(sharded[:3])}{' ...' if len(sharded) > 3 else ''} may be sharded; "
                    "on CPU use optim=rowwise_adagrad (or optim.embedding.name=adagrad|sgd), or replicate every "
                    "table with sharding=data_parallel, where adam runs",
                )

    def _check_over_time(self) -> None:
        """Deltas, epochs and the target AUC against the data they need."""
        multi_hot = self.data.criteo.multi_hot_sizes or self.data.parquet.multi_hot_sizes
        if self.deltas.every_steps and multi_hot and self.data.source != DataSource.synthetic:
            _fail(
                "deltas.every_steps",
                self.deltas.every_steps,
                "deltas track the ids each batch holds, and multi-hot ids are expanded on the device: "
                "set the multi_hot_sizes to null, or deltas.every_steps=0",
            )
        if self.trainer.max_epochs is not None and self.data.source != DataSource.parquet:
            _fail(
                "trainer.max_epochs",
                self.trainer.max_epochs,
                "passes over a training window are counted for data.source=parquet; use trainer.max_steps",
            )
        if self.trainer.target_auc is not None and self.data.eval_batches == 0:
            _fail(
                "data.eval_batches",
                0,
                "trainer.target_auc needs an eval set: give data.eval_batches > 0, or set trainer.target_auc=null",
            )

    def _check_source(self) -> None:
        """What the data source can feed the model: labels per task, weights per id, Parquet columns."""
        if self.data.source == DataSource.synthetic:
            for i, t in enumerate(self.model.tables):
                if t.pooling != int(t.pooling):
                    _fail(
                        f"model.tables[{i}].pooling",
                        t.pooling,
                        "synthetic data draws a whole number of ids per sample: give an integer (a fractional "
                        "pooling factor describes real data, data.source=parquet)",
                    )
        if self.data.source == DataSource.criteo and self.model.dense_in_features != 13:
            _fail(
                "model.dense_in_features",
                self.model.dense_in_features,
                "Criteo data has 13 dense features: set model.dense_in_features=13 (and a bottom MLP) with "
                "data.source=criteo",
            )
        if self.data.source == DataSource.criteo and len(self.model.tasks) > 1:
            _fail(
                "model.tasks",
                [t.name for t in self.model.tasks],
                "Criteo data has one label column: use one task with data.source=criteo, or data with a "
                "label per task (data.source=synthetic makes one per task)",
            )
        if self.data.source == DataSource.parquet:
            self._check_parquet()
        elif self.model.weighted:
            _fail(
                "model.weighted",
                True,
                f"{self.data.source} data has no per-id weights: use data.source=parquet with weights declared "
                "(data.parquet.sparse[*].weights), or set model.weighted=false",
            )

    def _check_parquet(self) -> None:
        """The Parquet columns against the model: its features, its dense width, a label per task, weights
        declared where the model is weighted and only there."""
        pq = self.data.parquet
        model_features = [f for t in self.model.tables for f in t.features]
        declared = [s.name for s in pq.sparse]
        if sorted(declared) != sorted(model_features):
            missing = [f for f in model_features if f not in declared]
            extra = [f for f in declared if f not in model_features]
            _fail(
                "data.parquet.sparse",
                declared,
                f"declare exactly the model's table features {model_features}"
                + (f"; missing {missing}" if missing else "")
                + (f"; not in any table: {extra}" if extra else ""),
            )
        if pq.multi_hot_sizes is not None and len(pq.multi_hot_sizes) != len(model_features):
            _fail(
                "data.parquet.multi_hot_sizes",
                list(pq.multi_hot_sizes),
                f"give one size per model feature, in table order ({len(model_features)}: {model_features})",
            )
        if pq.dense_width() != self.model.dense_in_features:
            flags = pq.dense_width() - len(pq.dense)
            _fail(
                "data.parquet.dense",
                list(pq.dense),
                f"the model takes model.dense_in_features={self.model.dense_in_features} dense features: list that "
                f"many columns, or set model.dense_in_features={pq.dense_width()}"
                + (f" ({len(pq.dense)} columns and {flags} missing flags)" if flags else "")
                + (" and model.bottom_mlp=[] (no dense features: no bottom MLP)" if not pq.dense else ""),
            )
        if len(pq.labels) != len(self.model.tasks):
            tasks = [t.name for t in self.model.tasks]
            _fail(
                "data.parquet.labels",
                list(pq.labels),
                f"the model has {len(tasks)} task(s) {tasks} (model.tasks), each with one logit: name one label "
                "column per task, in the tasks' order, or set model.tasks to one entry per label column",
            )
        weighted = [s.name for s in pq.sparse if s.weights]
        if weighted and not self.model.weighted:
            _fail(
                "data.parquet.sparse",
                weighted,
                "these features declare weights, but the model's tables are unweighted (the weights would be "
                "ignored): set model.weighted=true, or drop their `weights`",
            )
        if self.model.weighted and not weighted:
            _fail(
                "model.weighted",
                True,
                "no feature of data.parquet.sparse declares weights: name a weights column for at least one "
                "(data.parquet.sparse[i].weights), or set model.weighted=false",
            )

    def _check_precisions(self) -> None:
        """Half-precision tables are sharded and never bf16 (fbgemm's training kernels); what the CPU
        (TorchRec's codecs on Gloo) cannot send in bf16."""
        if self.model.embedding_precision == Precision.bf16:
            _fail(
                "model.embedding_precision",
                "bf16",
                "fbgemm 1.8's training kernels store table weights in fp32 or fp16 only (its CUDA lookups and "
                "updates have no bf16 weight type, its CPU ones neither, and TorchRec's cache for bf16 tables "
                "cannot be made on a GPU); use fp16: the same 2 bytes per weight, fp32 optimizer state",
            )
        if self.model.embedding_precision != Precision.fp32:
            replicated = [t.name for t in self.model.tables if self.sharding.pinned(t) == ShardingType.data_parallel]
            if replicated:
                _fail(
                    "model.embedding_precision",
                    str(self.model.embedding_precision),
                    f"table(s) {', '.join(replicated[:3])}{' ...' if len(replicated) > 3 else ''} are pinned to "
                    "data_parallel, where a torch optimizer would train the half-precision weights directly "
                    "(its state and eps underflow); shard them (e.g. sharding=auto or table_wise), or keep "
                    "model.embedding_precision=fp32",
                )
        if self.topology.device != Device.cpu:
            return
        for name in ("qcomms_forward", "qcomms_backward"):
            if getattr(self.sharding, name) == Precision.bf16:
                _fail(
                    f"sharding.{name}",
                    "bf16",
                    "TorchRec's quantized comms fall back from bf16 to fp16 on Gloo (CPU), so bf16 would not be "
                    "what runs; on CPU use fp16 (or fp32), bf16 with topology.device=cuda",
                )


def validate(cfg: Config) -> None:
    """Check what the schema's types cannot (sizes, names, consistency); OmegaConf has already
    refused unknown keys, wrong types and values outside each enum when composing.

    Raises:
        ConfigError: naming the key, the bad value and the fix.
    """
    cfg.check()


@functools.cache
def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can extend it (`defaults: [base_config, ...]`); once per
    process (Hydra's ConfigStore is a process-wide singleton and `Config` does not change)."""
    ConfigStore.instance().store(name="base_config", node=Config)


def to_config(cfg: DictConfig | Config) -> Config:
    """Turn a composed DictConfig into the plain `Config` dataclass (typed, attribute access).

    A DictConfig already typed by the schema (Hydra's composition, which extends `base_config`) converts
    as it is; any other (a YAML file, a masked copy) is merged onto the schema first, which types it."""
    if isinstance(cfg, Config):
        return cfg
    typed = cfg if OmegaConf.get_type(cfg) is Config else OmegaConf.merge(OmegaConf.structured(Config), cfg)
    return cast(Config, OmegaConf.to_object(typed))


def validate_world(cfg: Config, world_size: int, local_world_size: int) -> None:
    """Check the config against the launcher's world; run before creating any process group.

    Raises:
        ConfigError: topology.nodes x ranks_per_node is not the launcher's world, or
            data.global_batch_size is not divisible by `world_size`.
    """
    tp = cfg.topology
    ranks_per_node = tp.ranks_per_node or local_world_size
    if local_world_size != ranks_per_node:
        _fail(
            "topology.ranks_per_node",
            tp.ranks_per_node,
            f"the launcher started {local_world_size} ranks per node (LOCAL_WORLD_SIZE); "
            f"set topology.ranks_per_node={local_world_size} or launch with --nproc_per_node={ranks_per_node}",
        )
    if tp.nodes * ranks_per_node != world_size:
        _fail(
            "topology.nodes",
            tp.nodes,
            f"topology '{tp.name}' has {tp.nodes} node(s) x {ranks_per_node} ranks = "
            f"{tp.nodes * ranks_per_node} ranks but the launcher started WORLD_SIZE={world_size}; "
            f"set topology.nodes={world_size // ranks_per_node} or launch with --nnodes={tp.nodes}",
        )
    if cfg.data.global_batch_size % world_size:
        _fail(
            "data.global_batch_size",
            cfg.data.global_batch_size,
            f"it must be divisible by the world size {world_size}, so every rank takes an equal slice",
        )
