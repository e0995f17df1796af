"""The trainer section: the loop's length, evaluation, logging, pipelining, dense sync and precision."""

from __future__ import annotations

from dataclasses import dataclass

from dlrm.config.checks import _fail, _require_count, _require_positive
from dlrm.config.choices import CpuGemm, DenseAllreduce, DensePrecision, DenseSync, OnNonfinite, Precision, ProgressMode


@dataclass
class TrainerConfig:
    """Loop control. Training stops at max_steps, or at max_samples if that comes first."""

    max_steps: int = 200
    """Steps to train."""
    max_samples: int | None = None
    """Global samples to train (max_samples // data.global_batch_size steps, at least one) if that comes
    before max_steps; None: max_steps decides."""
    max_epochs: int | None = None
    """Passes over the training window of a Parquet dataset (data.parquet: its files, or the periods of
    data.parquet.periods.train) to train, the first continuing the pass a resumed run was in (a
    continuation over added periods: the rows not read yet); set, it replaces max_steps and max_samples."""
    select_metric: str | None = None
    """The evaluation figure that selects the best model: auc (higher is better), ne or logloss (lower
    is better), per task as `ne/<task>`; recorded in summary.json (best_step, best_value) and used by
    `patience`. None: none."""
    patience: int = 0
    """With select_metric: stop after this many evaluations in a row that do not improve it (early
    stopping); 0: never stop for it."""
    eval_every_steps: int = 0
    """Evaluate every this many steps; 0 evaluates only at the end."""
    log_every_steps: int = 20
    """Steps per log window: metrics, the console and the per-phase breakdown report once a window."""
    pipeline: bool = True
    """TorchRec's TrainPipelineSparseDist (overlaps the input alltoall with compute)."""
    progress: ProgressMode = ProgressMode.auto
    """A bar, log lines or nothing (auto: a bar on a terminal, lines otherwise)."""
    dense_allreduce: DenseAllreduce = DenseAllreduce.flat
    """flat (DDP's allreduce over all ranks) or hierarchical (reduce-scatter inside each node,
    allreduce across nodes, allgather inside the node: see dlrm.distributed.dense_sync)."""
    dense_sync: DenseSync = DenseSync.allreduce
    """allreduce (the dense gradients every step) or local_sgd (torch's post-local SGD: after
    local_sgd_warmup_steps synchronous steps, each rank steps its dense weights alone and they are
    averaged every sync_period steps; see dlrm.distributed.local_sgd)."""
    sync_period: int = 1
    """With dense_sync=local_sgd: steps between averagings of the dense weights (H); evaluations and
    periodic checkpoints fall on multiples of it. Keep 1 otherwise."""
    local_sgd_warmup_steps: int = 0
    """With dense_sync=local_sgd: synchronous (allreduce) steps before local SGD starts, a multiple of
    sync_period. Keep 0 otherwise."""
    resume: str | None = None
    """None (start fresh), "auto" (the newest complete checkpoint in checkpoint.dir, if any), or the
    path of one checkpoint (a step_* directory)."""
    eval_only: bool = False
    """Load `resume` and evaluate, without training."""
    dense_precision: DensePrecision = DensePrecision.fp32
    """fp32, or bf16 (autocast of the forward pass: the MLPs compute in bfloat16, the dot interaction
    in fp32; weights, embeddings, gradients and optimizer state stay fp32)."""
    dense_allreduce_precision: Precision = Precision.fp32
    """The wire precision of the dense gradients' allreduce (fp32, bf16, fp16): torch's DDP compression
    hooks (bf16_compress_hook / fp16_compress_hook), or with dense_allreduce=hierarchical its three
    steps wrapped by bf16_compress_wrapper / fp16_compress_wrapper. Each rank's gradients are rounded
    to it, averaged in it, and cast back to fp32 for the optimizer. Not with dense_sync=local_sgd
    (after its warm-up nothing is allreduced to compress)."""
    tf32: bool = True
    """Let CUDA matmuls use TF32 (no effect on CPU)."""
    cpu_gemm: CpuGemm = CpuGemm.auto
    """Whose fp32 products the MLP layers use on the CPU: mkl (torch's), onednn, or auto: oneDNN on a
    non-Intel CPU with AVX-512, where MKL runs its AVX2 kernels (2.2x slower there), else MKL. The same
    sums in another order; bf16 products are oneDNN's either way. The choice is logged."""
    compile_dense: bool = False
    """torch.compile (Inductor) the bottom MLP, the interaction and the top MLP, each at its first call
    (tens of seconds per process); the embedding lookup stays eager. It fuses the DCN cross net's
    element-wise work on a GPU; on CPU it measured slower (docs/benchmark-results.md)."""
    on_nonfinite: OnNonfinite = OnNonfinite.stop
    """On a non-finite loss: stop (raise, naming the last good checkpoint) or skip (drop the batch: no
    backward, no update; needs pipeline=false, since the pipeline's fused update runs unchecked)."""
    tensorboard: bool = True
    """Write TensorBoard scalars to <run dir>/tensorboard."""
    breakdown: bool = True
    """Profile the last step of every breakdown_every-th log window, and the run's last step
    (torch.profiler), for the per-phase times; the profiler's start, stop and reading are kept off the
    throughput clock."""
    breakdown_every: int = 10
    """With breakdown: log windows per profiled step (1: every window)."""
    profile: list[int] | None = None
    """[first, last] steps to trace with torch.profiler on rank 0 (<run dir>/profile, for TensorBoard
    or Perfetto); None: no trace."""
    comms_bench: str | None = None
    """A bench.json of `dlrm.comms.measure`: the measured-vs-model comparison fits the model's alpha and
    B to it (None: the topology config's links)."""
    target_auc: float | None = None
    """Stop at the first evaluation whose AUC reaches it (MLPerf's time to target; the summary records
    steps_to_target and samples_to_target); None: train to max_steps. Needs eval_every_steps > 0 and
    data.eval_batches > 0."""
    collective_timeout_s: float = 1800.0
    """How long a collective of the training process group waits for the other ranks before it fails
    (a stalled rank, a dead link): torch's `timeout` of init_process_group. Long enough for the
    longest single-rank pause between collectives (rank 0 hashing a large checkpoint at save, the
    first plan on a big model); default 30 minutes."""
    intra_op_threads: int | None = None
    """torch's intra-op (OpenMP) threads per rank; None: OMP_NUM_THREADS or MKL_NUM_THREADS if set (or a
    torch.set_num_threads made before the trainer), else the usable cores divided by the ranks on the
    node (LOCAL_WORLD_SIZE), at least 1 (dlrm.trainer.threads; the choice is logged)."""
    sync_every_step: bool = False
    """Wait for the device after every step (torch.cuda.synchronize): off by default, so the host runs
    ahead of the GPU, bounded by the pipeline's depth; on only to compare (the old behaviour) or to
    localise a device error to its step. No effect on CPU."""

    def check(self, key: str = "trainer") -> None:
        _require_positive(f"{key}.max_steps", self.max_steps)
        _require_positive(f"{key}.collective_timeout_s", self.collective_timeout_s)
        if self.max_samples is not None:
            _require_positive(f"{key}.max_samples", self.max_samples)
        if self.max_epochs is not None and (not isinstance(self.max_epochs, int) or self.max_epochs < 1):
            _fail(f"{key}.max_epochs", self.max_epochs, "give the passes over the training window, an integer >= 1")
        _require_count(f"{key}.eval_every_steps", self.eval_every_steps, "only at the end")
        _require_positive(f"{key}.log_every_steps", self.log_every_steps)
        _require_positive(f"{key}.breakdown_every", self.breakdown_every)
        if self.intra_op_threads is not None:
            _require_positive(f"{key}.intra_op_threads", self.intra_op_threads)
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
        _require_count(f"{key}.patience", self.patience, "no early stopping")
        if self.select_metric is not None and self.select_metric.split("/", 1)[0] not in ("auc", "ne", "logloss"):
            _fail(f"{key}.select_metric", self.select_metric, "use auc, ne or logloss (per task: ne/<task>), or null")
        if self.patience and (self.select_metric is None or self.eval_every_steps == 0):
            _fail(
                f"{key}.patience",
                self.patience,
                "early stopping compares evaluations during training: set trainer.select_metric (e.g. ne) and "
                "trainer.eval_every_steps > 0",
            )
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
