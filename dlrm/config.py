"""Typed configuration: dataclass schemas registered in Hydra's ConfigStore, and validation.

The schemas are the one source of defaults (the default options in conf/ restate none of them).
Choices are enums, so Hydra refuses a misspelt key, a wrongly typed value or a value outside its
choices while composing (`dlrm.compose`). Each section's `check` then tests what types cannot
express (sizes, names, consistency) next to its fields, and `Config.check` what spans sections;
a ConfigError names the key, the bad value and the fix, before any process group exists.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NoReturn, cast

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from dlrm.choices import (
    Backend,
    ComputeKernel,
    DataSource,
    DenseAllreduce,
    DenseOptimizer,
    DensePrecision,
    DenseSync,
    Device,
    EmbeddingOptimizer,
    Fabric,
    Interaction,
    OnNonfinite,
    Precision,
    ProgressMode,
    ShardingStrategy,
    ShardingType,
)
from dlrm.errors import UserError


class ConfigError(UserError, ValueError):
    """An invalid configuration; the message names the key, the value and the fix."""

    same_on_all_ranks = True  # every rank composes and validates the same config


def _fail(key: str, value, fix: str) -> NoReturn:
    raise ConfigError(f"config key '{key}' = {value!r} is invalid: {fix}")


def _require_positive(key: str, value) -> None:
    if value is None or not value > 0 or math.isinf(value):  # `not >` also catches nan
        _fail(key, value, "it must be a positive, finite number")


def _require_count(key: str, value: int, zero: str) -> None:
    if value < 0:
        _fail(key, value, f"use 0 ({zero}) or a positive count")


@dataclass
class TableConfig:
    """One embedding table: `rows` x `dim`, looked up by the sparse features in `features`.

    `pooling` is the number of ids per sample of each feature (the synthetic data draws that many;
    the planner uses it as the pooling factor). `sharding` optionally pins this table's sharding type.
    """

    name: str = MISSING
    rows: int = MISSING
    dim: int = MISSING
    features: list[str] = MISSING
    pooling: int = 1
    sharding: ShardingType | None = None

    def check(self, key: str) -> None:
        if not self.name:
            _fail(f"{key}.name", self.name, "give each table a unique, non-empty name")
        _require_positive(f"{key}.rows", self.rows)
        _require_positive(f"{key}.dim", self.dim)
        if self.dim % 4:
            _fail(
                f"{key}.dim",
                self.dim,
                f"fbgemm's embedding kernels need a multiple of 4; use {self.dim + 4 - self.dim % 4}",
            )
        _require_positive(f"{key}.pooling", self.pooling)
        if not self.features:
            _fail(f"{key}.features", list(self.features), "list the sparse features this table serves")


@dataclass
class ModelConfig:
    """DLRM: bottom MLP over dense features, embedding tables, interaction, top MLP -> 1 logit.

    embedding_precision: the dtype the table weights are stored in (fp32, fp16, bf16): TorchRec's
    `EmbeddingBagConfig.data_type`, which fbgemm's kernels take as `weights_precision` and TorchRec's
    planner as the bytes per weight. fp16/bf16 halve the tables' memory; the lookups' outputs and the
    optimizer state stay fp32, and fbgemm rounds each update stochastically. The weights are part of
    the model (its state dict, checkpoints, exports), hence a model key. fbgemm's CPU kernels have no
    bf16: on CPU use fp32 or fp16.
    """

    interaction: Interaction = Interaction.dot
    dense_in_features: int = 13
    bottom_mlp: list[int] = field(default_factory=lambda: [64, 16])
    top_mlp: list[int] = field(default_factory=lambda: [64, 32, 1])
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 64
    tables: list[TableConfig] = field(default_factory=list)
    embedding_precision: Precision = Precision.fp32

    def check(self, key: str = "model") -> None:
        _require_positive(f"{key}.dense_in_features", self.dense_in_features)
        for mlp in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, mlp)
            if not sizes:
                _fail(f"{key}.{mlp}", list(sizes), "list at least one layer size")
            for i, size in enumerate(sizes):
                _require_positive(f"{key}.{mlp}[{i}]", size)
        if self.top_mlp[-1] != 1:
            _fail(f"{key}.top_mlp", list(self.top_mlp), "the last layer must have size 1 (one logit)")
        if self.interaction == Interaction.dcn:
            _require_positive(f"{key}.dcn_num_layers", self.dcn_num_layers)
            _require_positive(f"{key}.dcn_low_rank_dim", self.dcn_low_rank_dim)
        if not self.tables:
            _fail(f"{key}.tables", [], "list at least one embedding table")
        names: set = set()
        features: set = set()
        for i, t in enumerate(self.tables):
            t.check(f"{key}.tables[{i}]")
            if t.name in names:
                _fail(f"{key}.tables[{i}].name", t.name, "give each table a unique, non-empty name")
            names.add(t.name)
            for f in t.features:
                if f in features:
                    _fail(f"{key}.tables[{i}].features", f, "a feature may be looked up in one table only")
                features.add(f)
        dims = {t.dim for t in self.tables}
        if len(dims) > 1:
            _fail(f"{key}.tables[*].dim", sorted(dims), "DLRM interactions need one embedding dim for all tables")
        if self.bottom_mlp[-1] != self.tables[0].dim:
            _fail(
                f"{key}.bottom_mlp",
                list(self.bottom_mlp),
                f"its last size must equal the embedding dim {self.tables[0].dim}, since the interaction combines them",
            )


@dataclass
class SyntheticConfig:
    """Criteo-shaped synthetic data: Zipf-distributed ids, labels from a hidden logistic model.

    zipf_alpha: power-law exponent of id popularity. signal: scale of the hidden model's logit
    (larger: more learnable). eval_offset: the eval split's first sample index.
    on_device: make batches on the training device (on CUDA: no host work, no pinning, no copy);
    false: on the host, then pinned and copied as file data is. The numbers are the same either way.
    """

    zipf_alpha: float = 1.05
    signal: float = 2.0
    eval_offset: int = 1_000_000_000
    on_device: bool = True

    def check(self, key: str) -> None:
        _require_positive(f"{key}.zipf_alpha", self.zipf_alpha)


@dataclass
class CriteoConfig:
    """Preprocessed Criteo (see `dlrm.data.preprocess`): the directory that holds the .npy days.

    train_days: days to train on ([] = every day in the manifest that is not in eval_days).
    eval_days: days to evaluate on; [] with eval_fraction > 0 holds out the last fraction of the train rows.
    multi_hot_sizes: ids per sample of each sparse column C1..C26 (MLPerf DCNv2 synthesis); None = one-hot.
    shuffle: train batch order reshuffled each epoch from the seed. prefetch_batches: batches read ahead.
    verify_checksums: compare each file's sha256 with manifest.json at start-up (the other checks always run).
    """

    dir: str | None = None
    train_days: list[int] = field(default_factory=list)
    eval_days: list[int] = field(default_factory=list)
    eval_fraction: float = 0.0
    multi_hot_sizes: list[int] | None = None
    shuffle: bool = True
    prefetch_batches: int = 4
    verify_checksums: bool = True


@dataclass
class DataConfig:
    """Where batches come from. The global batch at step k is the same for any world size.

    eval_batches: global batches of the eval split scored at each evaluation (0: none).
    """

    source: DataSource = DataSource.synthetic
    global_batch_size: int = 512
    eval_batches: int = 16
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    criteo: CriteoConfig = field(default_factory=CriteoConfig)

    def check(self, key: str = "data") -> None:
        _require_positive(f"{key}.global_batch_size", self.global_batch_size)
        _require_count(f"{key}.eval_batches", self.eval_batches, "no evaluation")
        if self.source == DataSource.synthetic:
            self.synthetic.check(f"{key}.synthetic")


@dataclass
class LinkConfig:
    """One level of the interconnect, as seen by one rank.

    bandwidth_GBps: unidirectional bandwidth per rank in GB/s (1e9 bytes/s), all links together.
    latency_us: per-message latency (the alpha of an alpha-beta model) in microseconds.
    fabric: how ranks at this level are wired. The defaults are placeholders of the right order for
    Gloo over loopback TCP: measure with `python -m dlrm.comms.bench`, fit with `dlrm.comms.report`.
    """

    fabric: Fabric = Fabric.switch
    bandwidth_GBps: float = 2.0
    latency_us: float = 50.0

    def check(self, key: str) -> None:
        _require_positive(f"{key}.bandwidth_GBps", self.bandwidth_GBps)
        if not self.latency_us >= 0 or math.isinf(self.latency_us):
            _fail(f"{key}.latency_us", self.latency_us, "use a finite latency >= 0")


@dataclass
class TopologyConfig:
    """Nodes x ranks per node and the fabric between them; drives process groups and the planner.

    ranks_per_node: None takes the launcher's LOCAL_WORLD_SIZE; a number is checked against it.
    hbm_GB / ddr_GB: device and host memory per rank available to the model, in GB.
    dense_tflops / mem_bw_GBps: peak dense matmul TFLOP/s and memory bandwidth (GB/s) per rank, for the
    step-time projection of `python -m dlrm.plan --scale` (None: unknown; pass --measured instead).
    The defaults describe one CPU machine (topology=cpu).
    """

    name: str = "cpu"
    nodes: int = 1
    ranks_per_node: int | None = None
    device: Device = Device.cpu
    backend: Backend = Backend.auto
    intra_node: LinkConfig = field(default_factory=LinkConfig)
    inter_node: LinkConfig = field(default_factory=LinkConfig)
    hbm_GB: float = 0.0
    ddr_GB: float = 8.0
    dense_tflops: float | None = None
    mem_bw_GBps: float | None = None

    def check(self, key: str = "topology") -> None:
        _require_positive(f"{key}.nodes", self.nodes)
        if self.ranks_per_node is not None:
            _require_positive(f"{key}.ranks_per_node", self.ranks_per_node)
        if self.device == Device.cpu and self.backend == Backend.nccl:
            _fail(f"{key}.backend", self.backend, "NCCL needs topology.device=cuda; use gloo or auto on CPU")
        self.intra_node.check(f"{key}.intra_node")
        self.inter_node.check(f"{key}.inter_node")
        if self.device == Device.cuda:
            _require_positive(f"{key}.hbm_GB", self.hbm_GB)
        _require_positive(f"{key}.ddr_GB", self.ddr_GB)
        for name in ("dense_tflops", "mem_bw_GBps"):
            if getattr(self, name) is not None:
                _require_positive(f"{key}.{name}", getattr(self, name))


@dataclass
class ShardingConfig:
    """How tables are sharded: `strategy` for all, overridden per table by `per_table` then table.sharding.

    Precedence for a table: sharding.per_table[name], then the table's own `sharding`, then `strategy`.
    `auto` lets TorchRec's planner choose among every type the device can run (on one rank: table_wise).
    qcomms_forward / qcomms_backward: the wire precision (fp32, fp16, bf16) of the sharded tables'
    collectives, TorchRec's quantized comms (QCommsConfig): the pooled embeddings' alltoall and
    reduce-scatter in the forward pass, their gradients' in the backward pass. The planner's
    communication estimates and DMP's sharders both get the codecs. TorchRec turns bf16 into fp16 on
    Gloo, so on CPU use fp32 or fp16.
    compute_kernel: the sharded tables' kernel (dlrm.choices.ComputeKernel); on a GPU,
    fused_uvm_caching keeps the tables (and their optimizer state) in host memory with a cache of
    `cache_load_factor` of each table's rows in HBM (None: TorchRec's 0.2), the Zion design of large
    host memory beside the accelerators; auto lets the planner offload only what HBM cannot hold.
    prefetch_pipeline: TorchRec's PrefetchTrainPipelineSparseDist, which fills the cache for the next
    batch on its own CUDA stream while this one trains (GPU, UVM caching, trainer.pipeline=true).
    """

    strategy: ShardingStrategy = ShardingStrategy.auto
    per_table: dict[str, ShardingType] = field(default_factory=dict)
    qcomms_forward: Precision = Precision.fp32
    qcomms_backward: Precision = Precision.fp32
    compute_kernel: ComputeKernel = ComputeKernel.auto
    cache_load_factor: float | None = None
    prefetch_pipeline: bool = False

    def check(self, tables: list[str], key: str = "sharding") -> None:
        for name, kind in self.per_table.items():
            if name not in tables:
                _fail(f"{key}.per_table.{name}", kind, f"no table of that name; tables: {', '.join(sorted(tables))}")
        if self.cache_load_factor is not None:
            if not 0 < self.cache_load_factor <= 1:  # `not <` also catches nan
                _fail(f"{key}.cache_load_factor", self.cache_load_factor, "give a fraction in (0, 1], e.g. 0.2")
            if self.compute_kernel not in (ComputeKernel.auto, ComputeKernel.fused_uvm_caching):
                _fail(
                    f"{key}.cache_load_factor",
                    self.cache_load_factor,
                    f"sharding.compute_kernel={self.compute_kernel} has no cache: use fused_uvm_caching (or auto)",
                )

    def check_device(self, device: str, pipeline: bool, key: str = "sharding") -> None:
        """The UVM kernels and the cache prefetch need a GPU (and the prefetch, the pipeline)."""
        uvm = self.compute_kernel in (ComputeKernel.fused_uvm, ComputeKernel.fused_uvm_caching)
        if device != "cuda" and uvm:
            _fail(
                f"{key}.compute_kernel",
                self.compute_kernel,
                "fbgemm's UVM kernels keep a GPU's tables in host memory; on CPU every table is in host "
                "memory already: use auto or fused",
            )
        if self.prefetch_pipeline:
            if device != "cuda":
                _fail(f"{key}.prefetch_pipeline", True, "the cache prefetch runs on a CUDA stream: GPU topologies only")
            if self.compute_kernel not in (ComputeKernel.auto, ComputeKernel.fused_uvm_caching):
                _fail(
                    f"{key}.prefetch_pipeline",
                    True,
                    "it prefetches into the UVM cache: use compute_kernel=fused_uvm_caching",
                )
            if not pipeline:
                _fail(
                    f"{key}.prefetch_pipeline",
                    True,
                    "it is a stage of the training pipeline: set trainer.pipeline=true",
                )

    def pinned(self, table: TableConfig) -> ShardingType | None:
        """The table's sharding type by the precedence above, or None: the planner chooses."""
        kind = self.per_table.get(table.name) or table.sharding or self.strategy
        return None if kind == ShardingStrategy.auto else ShardingType(kind)


@dataclass
class EmbeddingOptimConfig:
    """Optimizer fused into the embedding backward pass (fbgemm)."""

    name: EmbeddingOptimizer = EmbeddingOptimizer.rowwise_adagrad
    lr: float = 0.05
    eps: float = 1e-8


@dataclass
class DenseOptimConfig:
    """Optimizer of the dense part (MLPs, interaction) and of data-parallel tables' gradients."""

    name: DenseOptimizer = DenseOptimizer.adagrad
    lr: float = 0.05
    eps: float = 1e-8


@dataclass
class ScheduleConfig:
    """MLPerf DLRM schedule: linear warmup from 0, constant, then polynomial decay to 0.

    Steps with warmup_steps=0 and decay_steps=0 keep the learning rate constant.
    """

    warmup_steps: int = 10
    decay_start_step: int = 0
    decay_steps: int = 0
    decay_power: float = 2.0

    def check(self, key: str) -> None:
        for name in ("warmup_steps", "decay_start_step", "decay_steps"):
            if getattr(self, name) < 0:
                _fail(f"{key}.{name}", getattr(self, name), "use 0 or a positive step count")
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            _fail(f"{key}.decay_start_step", self.decay_start_step, "decay must start after warmup ends")


@dataclass
class OptimConfig:
    embedding: EmbeddingOptimConfig = field(default_factory=EmbeddingOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def check(self, key: str = "optim") -> None:
        for part in ("embedding", "dense"):
            _require_positive(f"{key}.{part}.lr", getattr(self, part).lr)
            _require_positive(f"{key}.{part}.eps", getattr(self, part).eps)
        self.schedule.check(f"{key}.schedule")


@dataclass
class TrainerConfig:
    """Loop control. Training stops at max_steps, or at max_samples if that comes first.

    eval_every_steps: 0 evaluates only at the end. progress: a bar, log lines or nothing.
    pipeline: TorchRec's TrainPipelineSparseDist (overlaps the input alltoall with compute).
    dense_allreduce: flat (DDP's allreduce over all ranks) or hierarchical (reduce-scatter inside
    each node, allreduce across nodes, allgather inside the node: see dlrm.core.dense_sync).
    dense_sync: allreduce (the dense gradients every step) or local_sgd (torch's post-local SGD:
    after local_sgd_warmup_steps synchronous steps, each rank steps its dense weights alone and
    they are averaged every sync_period steps; see dlrm.core.local_sgd).
    resume: None (start fresh), "auto" (the newest complete checkpoint in checkpoint.dir, if any),
    or the path of one checkpoint (a step_* directory).
    eval_only: load `resume` and evaluate, without training.
    dense_precision: fp32, or bf16 (autocast of the forward pass: the MLPs compute in bfloat16, the
    dot interaction in fp32; weights, embeddings, gradients and optimizer state stay fp32).
    dense_allreduce_precision: the wire precision of the dense gradients' allreduce (fp32, bf16,
    fp16): torch's DDP compression hooks (bf16_compress_hook / fp16_compress_hook), or with
    dense_allreduce=hierarchical its three steps wrapped by bf16_compress_wrapper / fp16_compress_wrapper.
    Each rank's gradients are rounded to it, averaged in it, and cast back to fp32 for the optimizer.
    Not with dense_sync=local_sgd (after its warm-up nothing is allreduced to compress).
    tf32: let CUDA matmuls use TF32 (no effect on CPU).
    compile_dense: torch.compile (Inductor) the bottom MLP, the interaction and the top MLP, each at
    its first call (tens of seconds per process); the embedding lookup stays eager. It fuses the DCN
    cross net's element-wise work on a GPU; on CPU it measured slower (benchmarks/RESULTS.md).
    on_nonfinite: stop (raise, naming the last good checkpoint) or skip (drop the batch: no
    backward, no update; needs pipeline=false, since the pipeline's fused update runs unchecked).
    tensorboard: write TensorBoard scalars to <run dir>/tensorboard.
    breakdown: profile the last step of each log window (torch.profiler) for the per-phase times.
    profile: [first, last] steps to trace with torch.profiler on rank 0 (<run dir>/profile, for
    TensorBoard or Perfetto); None: no trace.
    comms_bench: a bench.json of `dlrm.comms.bench`: the measured-vs-model comparison fits the model's
    alpha and B to it (None: the topology config's links).
    target_auc: stop at the first evaluation whose AUC reaches it (MLPerf's time to target; the
    summary records steps_to_target and samples_to_target); None: train to max_steps. Needs
    eval_every_steps > 0 and data.eval_batches > 0.
    collective_timeout_s: how long a collective of the training process group waits for the other
    ranks before it fails (a stalled rank, a dead link): torch's `timeout` of init_process_group.
    Long enough for the longest single-rank pause between collectives (rank 0 hashing a large
    checkpoint at save, the first plan on a big model); default 30 minutes.
    """

    max_steps: int = 200
    max_samples: int | None = None
    eval_every_steps: int = 0
    log_every_steps: int = 20
    pipeline: bool = True
    progress: ProgressMode = ProgressMode.auto
    dense_allreduce: DenseAllreduce = DenseAllreduce.flat
    dense_sync: DenseSync = DenseSync.allreduce
    sync_period: int = 1
    local_sgd_warmup_steps: int = 0
    resume: str | None = None
    eval_only: bool = False
    dense_precision: DensePrecision = DensePrecision.fp32
    dense_allreduce_precision: Precision = Precision.fp32
    tf32: bool = True
    compile_dense: bool = False
    on_nonfinite: OnNonfinite = OnNonfinite.stop
    tensorboard: bool = True
    breakdown: bool = True
    profile: list[int] | None = None
    comms_bench: str | None = None
    target_auc: float | None = None
    collective_timeout_s: float = 1800.0

    def check(self, key: str = "trainer") -> None:
        _require_positive(f"{key}.max_steps", self.max_steps)
        _require_positive(f"{key}.collective_timeout_s", self.collective_timeout_s)
        if self.max_samples is not None:
            _require_positive(f"{key}.max_samples", self.max_samples)
        _require_count(f"{key}.eval_every_steps", self.eval_every_steps, "only at the end")
        _require_positive(f"{key}.log_every_steps", self.log_every_steps)
        self._check_local_sgd(key)
        if self.on_nonfinite == OnNonfinite.skip and self.pipeline:
            _fail(
                f"{key}.on_nonfinite",
                self.on_nonfinite,
                "skip checks each loss before its backward pass, which the pipeline cannot do: "
                "set trainer.pipeline=false, or use stop",
            )
        if self.profile is not None and (len(self.profile) != 2 or not 1 <= self.profile[0] <= self.profile[1]):
            _fail(f"{key}.profile", self.profile, "give [first, last] steps to trace, 1 <= first <= last, e.g. [20,25]")
        if self.eval_only and not self.resume:
            _fail(f"{key}.eval_only", self.eval_only, "name the checkpoint to evaluate: trainer.resume=PATH (or auto)")
        if self.target_auc is not None:
            if not 0.5 < self.target_auc < 1.0:  # `not <` also catches nan
                _fail(f"{key}.target_auc", self.target_auc, "give an AUC in (0.5, 1), e.g. 0.80275, or null")
            if self.eval_every_steps == 0:
                _fail(
                    f"{key}.eval_every_steps",
                    self.eval_every_steps,
                    "trainer.target_auc stops at an evaluation: evaluate during training, "
                    "e.g. trainer.eval_every_steps=100",
                )

    def _check_local_sgd(self, key: str) -> None:
        """Averaging points are the steps W + k*H (W the warm-up, H the period): evaluation sees
        the dense weights only there, where every rank holds the same ones."""
        h, w = self.sync_period, self.local_sgd_warmup_steps
        if not isinstance(h, int) or h < 1:
            _fail(f"{key}.sync_period", h, "give the steps between averagings of the dense weights, an integer >= 1")
        _require_count(f"{key}.local_sgd_warmup_steps", w, "no synchronous warm-up")
        if self.dense_sync != DenseSync.local_sgd:
            if h != 1 or w:
                name = "sync_period" if h != 1 else "local_sgd_warmup_steps"
                _fail(
                    f"{key}.{name}",
                    getattr(self, name),
                    "it applies to local SGD only: set trainer.dense_sync=local_sgd",
                )
            return
        if self.dense_allreduce_precision != Precision.fp32:
            _fail(
                f"{key}.dense_allreduce_precision",
                str(self.dense_allreduce_precision),
                "trainer.dense_sync=local_sgd allreduces no gradients after its warm-up (it averages weights), "
                "so there is nothing to compress: use trainer.dense_allreduce_precision=fp32, or "
                "trainer.dense_sync=allreduce",
            )
        if self.dense_allreduce == DenseAllreduce.hierarchical:
            _fail(
                f"{key}.dense_allreduce",
                self.dense_allreduce,
                "trainer.dense_sync=local_sgd replaces the dense allreduce by periodic averaging; "
                "use trainer.dense_allreduce=flat, or trainer.dense_sync=allreduce",
            )
        if w % h:
            _fail(f"{key}.local_sgd_warmup_steps", w, f"use a multiple of trainer.sync_period={h}, e.g. {w - w % h}")
        if self.eval_every_steps % h:
            _fail(
                f"{key}.eval_every_steps",
                self.eval_every_steps,
                f"with local SGD, evaluate at averaging steps: use a multiple of trainer.sync_period={h}",
            )


@dataclass
class CheckpointConfig:
    """Distributed checkpoints (dlrm.core.checkpoint).

    dir: where checkpoints go (None: <run dir>/checkpoints). every_steps: 0 = no periodic saves.
    at_end: save when training ends. keep: complete checkpoints kept (older ones that this
    invocation wrote are deleted: never an earlier invocation's).
    verify: check every file's sha256 against the manifest before loading (false: sizes only).
    on_signal: on SIGINT/SIGTERM (Ctrl-C, preemption) save a checkpoint at the step where the run
    stops (the next log step, dlrm.core.stop) before exiting; false: stop without saving.
    """

    dir: str | None = None
    every_steps: int = 0
    at_end: bool = True
    keep: int = 2
    verify: bool = True
    on_signal: bool = False

    def check(self, key: str = "checkpoint") -> None:
        _require_count(f"{key}.every_steps", self.every_steps, "no periodic saves")
        _require_positive(f"{key}.keep", self.keep)


@dataclass
class RunConfig:
    """name: a named run lives in outputs/NAME (unless hydra.run.dir is given), so a later
    invocation with the same name and trainer.resume=auto continues it (dlrm.core.runs).
    None: a new timestamped run directory."""

    name: str | None = None

    def check(self, key: str = "run") -> None:
        if self.name is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", self.name):
            _fail(f"{key}.name", self.name, "use letters, digits, '.', '_' and '-' only (it names a directory)")


@dataclass
class Config:
    """The whole job. Its defaults are the default job (`python -m dlrm.train` without overrides)
    but for model.tables, which model=dlrm_small fills; conf/ holds only what other options change."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    seed: int = 0

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
        self.run.check()
        if self.trainer.target_auc is not None and self.data.eval_batches == 0:
            _fail(
                "data.eval_batches",
                0,
                "trainer.target_auc needs an eval set: give data.eval_batches > 0, or set trainer.target_auc=null",
            )
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

    def _check_precisions(self) -> None:
        """Half-precision tables are sharded; what the CPU (fbgemm's CPU kernels, TorchRec's codecs on
        Gloo) cannot store or send in bf16."""
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
        if self.model.embedding_precision == Precision.bf16:
            _fail(
                "model.embedding_precision",
                "bf16",
                "fbgemm's CPU embedding kernels have no bf16 weights; on CPU use fp16 (or fp32), "
                "bf16 with topology.device=cuda",
            )
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
    refused unknown keys, wrong types and values outside each enum when composing."""
    cfg.check()


def register_configs() -> None:
    """Register the schema so `conf/config.yaml` can extend it (`defaults: [base_config, ...]`)."""
    ConfigStore.instance().store(name="base_config", node=Config)


def to_config(cfg: DictConfig | Config) -> Config:
    """Turn a composed DictConfig into the plain `Config` dataclass (typed, attribute access)."""
    if isinstance(cfg, Config):
        return cfg
    return cast(Config, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), cfg)))


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
