"""Typed configuration: dataclass schemas registered in Hydra's ConfigStore, and validation.

The schemas make Hydra reject a misspelt key or a wrongly typed value when it composes the
config; `validate` then checks what types cannot express (sizes, names, consistency) and raises
`ConfigError` naming the key, the bad value and the fix, before any process group exists.
"""

from __future__ import annotations

from dlrm.errors import UserError
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

SHARDING_TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "grid_shard",
    "data_parallel",
)
SHARDING_STRATEGIES = ("auto",) + SHARDING_TYPES
INTERACTIONS = ("dot", "dcn")
EMBEDDING_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("cpu", "cuda")
FABRICS = ("ring", "fully_connected", "switch")
DATA_SOURCES = ("synthetic", "criteo")


class ConfigError(UserError, ValueError):
    """An invalid configuration; the message names the key, the value and the fix."""


@dataclass
class TableConfig:
    """One embedding table: `rows` x `dim`, looked up by the sparse features in `features`.

    `pooling` is the number of ids per sample of each feature (the synthetic data draws that many;
    the planner uses it as the pooling factor). `sharding` optionally pins this table's sharding type.
    """

    name: str = MISSING
    rows: int = MISSING
    dim: int = MISSING
    features: List[str] = MISSING
    pooling: int = 1
    sharding: Optional[str] = None


@dataclass
class ModelConfig:
    """DLRM: bottom MLP over dense features, embedding tables, interaction, top MLP -> 1 logit."""

    interaction: str = "dot"
    dense_in_features: int = 13
    bottom_mlp: List[int] = field(default_factory=lambda: [64, 16])
    top_mlp: List[int] = field(default_factory=lambda: [64, 1])
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 64
    tables: List[TableConfig] = field(default_factory=list)


@dataclass
class SyntheticConfig:
    """Criteo-shaped synthetic data: Zipf-distributed ids, labels from a hidden logistic model."""

    zipf_alpha: float = 1.05
    signal: float = 2.0
    eval_offset: int = 1_000_000_000


@dataclass
class CriteoConfig:
    """Preprocessed Criteo (see `dlrm.data.preprocess`): the directory that holds the .npy days.

    train_days: days to train on ([] = every day in the manifest that is not in eval_days).
    eval_days: days to evaluate on; [] with eval_fraction > 0 holds out the last fraction of the train rows.
    multi_hot_sizes: ids per sample of each sparse column C1..C26 (MLPerf DCNv2 synthesis); None = one-hot.
    shuffle: train batch order reshuffled each epoch from the seed. prefetch_batches: batches read ahead.
    """

    dir: Optional[str] = None
    train_days: List[int] = field(default_factory=list)
    eval_days: List[int] = field(default_factory=list)
    eval_fraction: float = 0.0
    multi_hot_sizes: Optional[List[int]] = None
    shuffle: bool = True
    prefetch_batches: int = 4


@dataclass
class DataConfig:
    """Where batches come from. The global batch at step k is the same for any world size."""

    source: str = "synthetic"
    global_batch_size: int = 512
    eval_batches: int = 8
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    criteo: CriteoConfig = field(default_factory=CriteoConfig)


@dataclass
class LinkConfig:
    """One level of the interconnect, as seen by one rank.

    bandwidth_GBps: unidirectional bandwidth per rank in GB/s (1e9 bytes/s), all links together.
    latency_us: per-message latency (the alpha of an alpha-beta model) in microseconds.
    fabric: ring | fully_connected | switch; how ranks at this level are wired.
    """

    fabric: str = "switch"
    bandwidth_GBps: float = 10.0
    latency_us: float = 10.0


@dataclass
class TopologyConfig:
    """Nodes x ranks per node and the fabric between them; drives process groups and the planner.

    ranks_per_node: None takes the launcher's LOCAL_WORLD_SIZE; a number is checked against it.
    hbm_GB / ddr_GB: device and host memory per rank available to the model, in GB.
    """

    name: str = "cpu"
    nodes: int = 1
    ranks_per_node: Optional[int] = None
    device: str = "cpu"
    backend: str = "auto"
    intra_node: LinkConfig = field(default_factory=LinkConfig)
    inter_node: LinkConfig = field(default_factory=LinkConfig)
    hbm_GB: float = 0.0
    ddr_GB: float = 8.0


@dataclass
class ShardingConfig:
    """How tables are sharded: `strategy` for all, overridden per table by `per_table` then table.sharding.

    Precedence for a table: sharding.per_table[name], then the table's own `sharding`, then `strategy`.
    `auto` lets TorchRec's planner choose among every type the device can run.
    """

    strategy: str = "auto"
    per_table: Dict[str, str] = field(default_factory=dict)


@dataclass
class EmbeddingOptimConfig:
    """Optimizer fused into the embedding backward pass (fbgemm)."""

    name: str = "rowwise_adagrad"
    lr: float = 0.05
    eps: float = 1e-8


@dataclass
class DenseOptimConfig:
    name: str = "adagrad"
    lr: float = 0.05
    eps: float = 1e-8


@dataclass
class ScheduleConfig:
    """MLPerf DLRM schedule: linear warmup from 0, constant, then polynomial decay to 0.

    Steps with warmup_steps=0 and decay_steps=0 keep the learning rate constant.
    """

    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0


@dataclass
class OptimConfig:
    embedding: EmbeddingOptimConfig = field(default_factory=EmbeddingOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)


@dataclass
class TrainerConfig:
    """Loop control. Training stops at max_steps, or at max_samples if that comes first.

    dense_allreduce: flat (DDP's allreduce over all ranks) or hierarchical (reduce-scatter inside
    each node, allreduce across nodes, allgather inside the node: see dlrm.comm_hooks).
    resume: None (start fresh), "auto" (the newest complete checkpoint in checkpoint.dir, if any),
    or the path of one checkpoint (a step_* directory).
    eval_only: load `resume` and evaluate, without training.
    dense_precision: fp32, or bf16 (autocast of the forward pass: the MLPs and interaction compute
    in bfloat16; weights, embeddings, gradients and optimizer state stay fp32).
    tf32: let CUDA matmuls use TF32 (no effect on CPU).
    on_nonfinite: stop (raise, naming the last good checkpoint) or skip (drop the batch: no
    backward, no update; needs pipeline=false, since the pipeline's fused update runs unchecked).
    """

    max_steps: int = 100
    max_samples: Optional[int] = None
    eval_every_steps: int = 0
    log_every_steps: int = 10
    pipeline: bool = True
    progress: str = "auto"
    dense_allreduce: str = "flat"
    resume: Optional[str] = None
    eval_only: bool = False
    dense_precision: str = "fp32"
    tf32: bool = True
    on_nonfinite: str = "stop"


@dataclass
class CheckpointConfig:
    """Distributed checkpoints (dlrm.checkpoint).

    dir: where checkpoints go (None: <run dir>/checkpoints). every_steps: 0 = no periodic saves.
    at_end: save when training ends. keep: complete checkpoints kept (older ones are deleted).
    """

    dir: Optional[str] = None
    every_steps: int = 0
    at_end: bool = True
    keep: int = 2


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = 0


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can extend it (`defaults: [base_config, ...]`)."""
    ConfigStore.instance().store(name="base_config", node=Config)


def to_config(cfg: DictConfig | Config) -> Config:
    """Turn a composed DictConfig into the plain `Config` dataclass (typed, attribute access)."""
    if isinstance(cfg, Config):
        return cfg
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), cfg))


def _fail(key: str, value, fix: str) -> None:
    raise ConfigError(f"config key '{key}' = {value!r} is invalid: {fix}")


def _require_positive(key: str, value) -> None:
    if value is None or value <= 0:
        _fail(key, value, "it must be a positive number")


def _require_choice(key: str, value, choices) -> None:
    if value not in choices:
        _fail(key, value, f"choose one of {', '.join(choices)}")


def validate(cfg: Config) -> None:
    """Check what the schema's types cannot; raise ConfigError on the first problem found."""
    m = cfg.model
    _require_choice("model.interaction", m.interaction, INTERACTIONS)
    _require_positive("model.dense_in_features", m.dense_in_features)
    for key, sizes in (("model.bottom_mlp", m.bottom_mlp), ("model.top_mlp", m.top_mlp)):
        if not sizes:
            _fail(key, list(sizes), "list at least one layer size")
        for i, size in enumerate(sizes):
            _require_positive(f"{key}[{i}]", size)
    if m.top_mlp[-1] != 1:
        _fail("model.top_mlp", list(m.top_mlp), "the last layer must have size 1 (one logit)")
    if m.interaction == "dcn":
        _require_positive("model.dcn_num_layers", m.dcn_num_layers)
        _require_positive("model.dcn_low_rank_dim", m.dcn_low_rank_dim)
    if not m.tables:
        _fail("model.tables", [], "list at least one embedding table")
    names, features = set(), set()
    for i, t in enumerate(m.tables):
        key = f"model.tables[{i}]"
        if not t.name or t.name in names:
            _fail(f"{key}.name", t.name, "give each table a unique, non-empty name")
        names.add(t.name)
        _require_positive(f"{key}.rows", t.rows)
        _require_positive(f"{key}.dim", t.dim)
        _require_positive(f"{key}.pooling", t.pooling)
        if not t.features:
            _fail(f"{key}.features", list(t.features), "list the sparse features this table serves")
        for f in t.features:
            if f in features:
                _fail(f"{key}.features", f, "a feature may be looked up in one table only")
            features.add(f)
        if t.sharding is not None:
            _require_choice(f"{key}.sharding", t.sharding, SHARDING_TYPES)
    dims = {t.dim for t in m.tables}
    if len(dims) > 1:
        _fail("model.tables[*].dim", sorted(dims), "DLRM interactions need one embedding dim for all tables")
    dim = dims.pop()
    if m.bottom_mlp[-1] != dim:
        _fail(
            "model.bottom_mlp",
            list(m.bottom_mlp),
            f"its last size must equal the embedding dim {dim}, since the interaction combines them",
        )

    d = cfg.data
    _require_choice("data.source", d.source, DATA_SOURCES)
    _require_positive("data.global_batch_size", d.global_batch_size)
    if d.eval_batches < 0:
        _fail("data.eval_batches", d.eval_batches, "use 0 (no evaluation) or a positive count")
    if d.source == "synthetic":
        _require_positive("data.synthetic.zipf_alpha", d.synthetic.zipf_alpha)

    tp = cfg.topology
    _require_positive("topology.nodes", tp.nodes)
    if tp.ranks_per_node is not None:
        _require_positive("topology.ranks_per_node", tp.ranks_per_node)
    _require_choice("topology.device", tp.device, DEVICES)
    _require_choice("topology.backend", tp.backend, BACKENDS)
    if tp.device == "cpu" and tp.backend == "nccl":
        _fail("topology.backend", tp.backend, "NCCL needs topology.device=cuda; use gloo or auto on CPU")
    for level in ("intra_node", "inter_node"):
        link = getattr(tp, level)
        _require_choice(f"topology.{level}.fabric", link.fabric, FABRICS)
        _require_positive(f"topology.{level}.bandwidth_GBps", link.bandwidth_GBps)
        if link.latency_us < 0:
            _fail(f"topology.{level}.latency_us", link.latency_us, "latency cannot be negative")
    if tp.device == "cuda":
        _require_positive("topology.hbm_GB", tp.hbm_GB)
    _require_positive("topology.ddr_GB", tp.ddr_GB)

    s = cfg.sharding
    _require_choice("sharding.strategy", s.strategy, SHARDING_STRATEGIES)
    for name, kind in s.per_table.items():
        if name not in names:
            _fail(f"sharding.per_table.{name}", kind, f"no table of that name; tables: {', '.join(sorted(names))}")
        _require_choice(f"sharding.per_table.{name}", kind, SHARDING_TYPES)

    o = cfg.optim
    _require_choice("optim.embedding.name", o.embedding.name, EMBEDDING_OPTIMIZERS)
    _require_choice("optim.dense.name", o.dense.name, DENSE_OPTIMIZERS)
    _require_positive("optim.embedding.lr", o.embedding.lr)
    _require_positive("optim.dense.lr", o.dense.lr)
    sch = o.schedule
    for key in ("warmup_steps", "decay_start_step", "decay_steps"):
        if getattr(sch, key) < 0:
            _fail(f"optim.schedule.{key}", getattr(sch, key), "use 0 or a positive step count")
    if sch.decay_steps and sch.decay_start_step < sch.warmup_steps:
        _fail("optim.schedule.decay_start_step", sch.decay_start_step, "decay must start after warmup ends")

    tr = cfg.trainer
    _require_positive("trainer.max_steps", tr.max_steps)
    if tr.max_samples is not None:
        _require_positive("trainer.max_samples", tr.max_samples)
    if tr.eval_every_steps < 0:
        _fail("trainer.eval_every_steps", tr.eval_every_steps, "use 0 (only at the end) or a positive count")
    _require_positive("trainer.log_every_steps", tr.log_every_steps)
    _require_choice("trainer.progress", tr.progress, ("auto", "bar", "lines", "none"))
    _require_choice("trainer.dense_allreduce", tr.dense_allreduce, ("flat", "hierarchical"))
    _require_choice("trainer.dense_precision", tr.dense_precision, ("fp32", "bf16"))
    _require_choice("trainer.on_nonfinite", tr.on_nonfinite, ("stop", "skip"))
    if tr.on_nonfinite == "skip" and tr.pipeline:
        _fail(
            "trainer.on_nonfinite",
            tr.on_nonfinite,
            "skip checks each loss before its backward pass, which the pipeline cannot do: "
            "set trainer.pipeline=false, or use stop",
        )
    if tr.eval_only and not tr.resume:
        _fail("trainer.eval_only", tr.eval_only, "name the checkpoint to evaluate: trainer.resume=PATH (or auto)")

    ck = cfg.checkpoint
    if ck.every_steps < 0:
        _fail("checkpoint.every_steps", ck.every_steps, "use 0 (no periodic saves) or a positive step count")
    _require_positive("checkpoint.keep", ck.keep)


def validate_world(cfg: Config, world_size: int, local_world_size: int) -> None:
    """Check the config against the launcher's world; run before creating any process group."""
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
