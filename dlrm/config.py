"""Typed configuration: dataclass schemas registered in Hydra's ConfigStore, and validation.

The schemas make Hydra reject a misspelt key or a wrongly typed value when it composes the
config; `validate` then checks what types cannot express (sizes, names, consistency) and raises
`ConfigError` naming the key, the bad value and the fix, before any process group exists.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from dlrm.errors import UserError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

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

    same_on_all_ranks = True  # every rank composes and validates the same config


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
    verify_checksums: compare each file's sha256 with manifest.json at start-up (the other checks always run).
    """

    dir: Optional[str] = None
    train_days: List[int] = field(default_factory=list)
    eval_days: List[int] = field(default_factory=list)
    eval_fraction: float = 0.0
    multi_hot_sizes: Optional[List[int]] = None
    shuffle: bool = True
    prefetch_batches: int = 4
    verify_checksums: bool = True


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
    tensorboard: write TensorBoard scalars to <run dir>/tensorboard.
    breakdown: profile the last step of each log window (torch.profiler) for the per-phase times.
    profile: [first, last] steps to trace with torch.profiler on rank 0 (<run dir>/profile, for
    TensorBoard or Perfetto); None: no trace.
    comms_bench: a bench.json of `dlrm.comms.bench`: the measured-vs-model comparison fits the model's
    alpha and B to it (None: the topology config's links).
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
    tensorboard: bool = True
    breakdown: bool = True
    profile: Optional[List[int]] = None
    comms_bench: Optional[str] = None


@dataclass
class CheckpointConfig:
    """Distributed checkpoints (dlrm.checkpoint).

    dir: where checkpoints go (None: <run dir>/checkpoints). every_steps: 0 = no periodic saves.
    at_end: save when training ends. keep: complete checkpoints kept (older ones are deleted).
    verify: check every file's sha256 against the manifest before loading (false: sizes only).
    """

    dir: Optional[str] = None
    every_steps: int = 0
    at_end: bool = True
    keep: int = 2
    verify: bool = True


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
    if value is None or not value > 0 or math.isinf(value):  # `not >` also catches nan
        _fail(key, value, "it must be a positive, finite number")


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
        if t.dim % 4:
            _fail(f"{key}.dim", t.dim, f"fbgemm's embedding kernels need a multiple of 4; use {t.dim + 4 - t.dim % 4}")
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
        if not link.latency_us >= 0 or math.isinf(link.latency_us):
            _fail(f"topology.{level}.latency_us", link.latency_us, "use a finite latency >= 0")
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
    for part in ("embedding", "dense"):
        _require_positive(f"optim.{part}.lr", getattr(o, part).lr)
        _require_positive(f"optim.{part}.eps", getattr(o, part).eps)
    if o.embedding.name == "adam" and tp.device == "cpu":
        # A table's sharding type, as dlrm.sharding.table_sharding resolves it (auto: the planner's choice).
        kinds = {t.name: s.per_table.get(t.name) or t.sharding or s.strategy for t in m.tables}
        from_planner = [name for name, kind in kinds.items() if kind != "data_parallel"]
        if from_planner:
            _fail(
                "optim.embedding.name",
                "adam",
                f"fbgemm's CPU kernels for sharded tables run sgd, adagrad and rowwise_adagrad only, and "
                f"table(s) {', '.join(from_planner[:3])}{' ...' if len(from_planner) > 3 else ''} may be sharded; "
                "on CPU use optim=rowwise_adagrad (or optim.embedding.name=adagrad|sgd), or replicate every "
                "table with sharding=data_parallel, where adam runs",
            )
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
    if tr.profile is not None and (len(tr.profile) != 2 or not 1 <= tr.profile[0] <= tr.profile[1]):
        _fail("trainer.profile", tr.profile, "give [first, last] steps to trace, 1 <= first <= last, e.g. [20,25]")
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


# ----------------------------------------------------------------------------------------------
# Overrides: checked against the schema and conf/ before Hydra composes them


def _schema_keys(cls=Config, prefix: str = "") -> Dict[str, object]:
    """Every dotted key of the schema -> its dataclass type, 'dict' or 'list' (open containers), or None."""
    keys: Dict[str, object] = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys[key] = type(default)
            keys.update(_schema_keys(type(default), key + "."))
        else:
            keys[key] = "dict" if isinstance(default, dict) else "list" if isinstance(default, list) else None
    return keys


def group_options(group: str) -> List[str]:
    """The options of a config group: the names of conf/<group>/*.yaml."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f"did you mean '{close[0]}'?" if close else ""


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuse an unknown key or group option among Hydra overrides, with a "did you mean".

    Hydra would refuse them too, but advises `+key=value`, which the closed schema refuses in turn.
    Keys under hydra, `~key` deletions and dict entries (sharding.per_table.NAME) are left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, parsed = OverridesParser.create(), []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except OverrideParseException as e:
            lines = str(e).strip().splitlines() or [type(e).__name__]
            reason = lines[1] if len(lines) > 1 and text in lines[0] else lines[0]  # skip "Error parsing 'x'"
            raise ConfigError(
                f"cannot parse the override '{text}' ({reason}); overrides look like key=value "
                "(e.g. trainer.max_steps=50; quote values with spaces or brackets)"
            ) from None
    keys = _schema_keys()
    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.is_delete() or o.package is not None:
            continue
        if key in groups:
            value = o.value()
            if value is None or not isinstance(value, str):  # experiment=null; a list is Hydra's business
                continue
            choices = group_options(key)
            if value not in choices:
                hint = _did_you_mean(value, choices)
                raise ConfigError(
                    f"unknown option '{value}' for config group '{key}'; "
                    + (hint + " " if hint else "")
                    + f"choose one of: {', '.join(choices)} (files in conf/{key}/)"
                )
            continue
        parent = key.rpartition(".")[0]
        prefixes = [key[:i] for i, c in enumerate(key) if c == "."]
        if key in keys or any(keys.get(p) in ("dict", "list") for p in prefixes):
            continue  # entries of open dicts and lists are Hydra's to check
        siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
        if parent in keys:  # a known section: suggest among its keys only
            close = difflib.get_close_matches(key.rpartition(".")[2], siblings, n=1, cutoff=0.7)
            fix = (f"did you mean '{parent}.{close[0]}'?" if close
                   else f"the keys under '{parent}' are: {', '.join(siblings)}")
        else:
            close = difflib.get_close_matches(key, list(keys) + groups, n=1, cutoff=0.8)
            fix = f"did you mean '{close[0]}'?" if close else "see `python -m dlrm.train --cfg job` for every key"
        raise ConfigError(f"unknown config key '{key}'; {fix}")


def _composition_error(e: Exception) -> ConfigError:
    """A ConfigError naming the key and the reason of Hydra's or OmegaConf's refusal."""
    from omegaconf.errors import OmegaConfBaseException

    cause = e
    while cause.__cause__ is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    key = getattr(cause, "full_key", None)
    reason = (getattr(cause, "msg", None) or str(cause)).strip().splitlines()[0]
    if key and "not in struct" in reason:  # a new entry of an open dict (sharding.per_table.NAME)
        return ConfigError(f"config key '{key}' does not exist yet; add it with '+{key}=VALUE'")
    if key:
        return ConfigError(f"config key '{key}' is invalid: {reason}; fix its override or YAML value")
    return ConfigError(f"cannot compose the config: {str(e).strip().splitlines()[0]}")


def compose(overrides: Sequence[str]) -> Config:
    """The typed Config for these Hydra overrides, composed from conf/ as `dlrm.train` does.

    Raises ConfigError for an unknown key or option (with a "did you mean"), a value of the wrong
    type, or anything else Hydra refuses. Does not `validate`.
    """
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides)
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_config(hydra_compose(config_name="config", overrides=list(overrides)))
    except (HydraException, OmegaConfBaseException) as e:
        raise _composition_error(e) from None
