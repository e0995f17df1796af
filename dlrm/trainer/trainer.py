"""One rank's trainer as built: its parts, and what one training step, one evaluation and one
checkpoint do with them (not when they happen)."""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR
from torch.profiler import record_function
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer

from dlrm.checkpoint import Checkpointer, CheckpointError
from dlrm.config import CheckpointConfig, OptimConfig, TrainerConfig
from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.data.source import BatchSource, PositionedSource, batches_on
from dlrm.deltas.publish import Publisher
from dlrm.distributed.cache_locks import cache_lines_unlocked
from dlrm.distributed.local_sgd import LocalSGD
from dlrm.distributed.sharding import describe_plan
from dlrm.distributed.world import World
from dlrm.run.records import planned_steps
from dlrm.trainer.evaluator import Evaluator, eval_batch_count
from dlrm.trainer.phases import STEP_RANGE
from dlrm.trainer.profiler import StepProfiler
from dlrm.trainer.reporter import Reporter, SummaryPart
from dlrm.trainer.stop import StopRequest
from dlrm.trainer.train_state import TrainState

log = logging.getLogger(__name__)


def forward(model: torch.nn.Module, device: torch.device, bf16: bool, batch):
    """model(batch) -> (loss, (loss, logits, labels)), under bf16 autocast if `bf16`."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        return model(batch)


@dataclass(frozen=True)
class TrainerSettings:
    """The config's values that the trainer, its loop and its resume read (`build` takes them from the Config)."""

    trainer: TrainerConfig
    """The training loop's section."""
    optim: OptimConfig
    """The optimizers: the lr schedule and the dense lr the log reports."""
    global_batch_size: int
    """Samples per step, over all ranks (data.global_batch_size)."""
    eval_batches: int
    """The eval batches an evaluation scores at most (data.eval_batches)."""
    checkpoint: CheckpointConfig
    """Checkpoints: kept, verified, saved on a stop signal."""
    run_name: str | None
    """The run's name (run.name), which a stopped run's message repeats; None: unnamed."""


@dataclass(eq=False)
class Trainer:
    """One rank's share of a DLRM training job, as `build` makes it.

    Fields: the config's `settings` and this rank (`world`); `run_dir` where rank 0 writes (None elsewhere
    or for no files); the training `device`, its `sync` (waits for the device's queued work) and process
    group `pg`; the batch `source` (replaceable before training); the sharding `plan`, the sharded `model`
    and its `dense_params`; the `optimizer`, the lr `schedule`, `local_sgd` (None without
    trainer.dense_sync=local_sgd) and the training `pipeline` (None without trainer.pipeline); the
    checkpointed `state`; the periodic components (`reporter`, `evaluator`, `profiler`, `checkpointer`
    and `deltas`, None without a directory) and the `stop` request of a signal; `summary_parts`, more
    components whose `summary_fields` the summary takes.
    """

    settings: TrainerSettings
    world: World
    run_dir: Path | None
    device: torch.device
    sync: Callable[[], None]
    pg: dist.ProcessGroup
    source: BatchSource
    plan: ShardingPlan
    model: DistributedModelParallel
    dense_params: int
    optimizer: CombinedOptimizer
    local_sgd: LocalSGD | None
    pipeline: TrainPipelineSparseDist | None
    state: TrainState
    reporter: Reporter
    evaluator: Evaluator
    profiler: StepProfiler
    checkpointer: Checkpointer | None
    deltas: Publisher | None
    stop: StopRequest
    summary_parts: list[SummaryPart] = field(default_factory=list)  # add to the summary (dlrm.train's cost model)
    skipped_steps: list[int] = field(default_factory=list)  # steps dropped for a non-finite loss
    schedule: LambdaLR = field(init=False)  # set once the state is resumed: positioned at its step

    @property
    def step(self) -> int:
        """The steps trained so far (the train state's)."""
        return self.state.step

    @step.setter
    def step(self, value: int) -> None:
        self.state.step = value

    @property
    def losses(self) -> list[float]:
        """The global mean loss of every logged window so far."""
        return self.reporter.losses

    @property
    def schedule_origin(self) -> int:
        """The step the lr schedule's clock starts at: 0, or with optim.schedule.on_new_data=restart
        the first step of the continuation over new data that this run's stream began at."""
        if self.settings.optim.schedule.on_new_data == "restart" and isinstance(self.source, PositionedSource):
            return self.source.stream_start
        return 0

    @property
    def total_steps(self) -> int:
        """Steps to train: trainer.max_steps, or fewer if trainer.max_samples comes first; with
        trainer.max_epochs, the step where that many passes over the training window end."""
        tr = self.settings.trainer
        if tr.max_epochs is not None and isinstance(self.source, PositionedSource):  # validated: Parquet
            return self.source.steps_for_passes(tr.max_epochs)
        return planned_steps(tr.max_steps, tr.max_samples, self.settings.global_batch_size)

    def summary_fields(self) -> dict:
        """The trainer's own summary entries: the sharding plan, the evaluator's (select_metric,
        target_auc), and the values this rank's reader changed (data_counts, logged; left out if none)."""
        fields = {"sharding_plan": describe_plan(self.plan), **self.evaluator.summary_fields({})}
        counts = getattr(self.source, "data_counts", None)  # values the reader changed (folded ids, ...)
        if counts is not None and any(counts().values()):
            fields["data_counts"] = counts()
            log.warning("data (this rank's reads): %s", ", ".join(f"{k} {v:,}" for k, v in counts().items()))
        return fields

    def save_checkpoint(self, background: bool = False) -> Path:
        """Checkpoint the current step (all ranks call it); returns the checkpoint's directory.

        background (with checkpoint.async_save): return once the state is staged on the host; the files
        follow, and the next save, a clean stop and the run's end wait for them.

        Raises:
            CheckpointError: no checkpoint directory, or the save was refused (`Checkpointer.save`).
        """
        if self.checkpointer is None:
            raise CheckpointError("no checkpoint directory: set checkpoint.dir or give the trainer a run dir")
        return self.checkpointer.save(self.step, self.state.state_dict(), self.state.manifest(), background)

    def batches(self, split: str, start_step: int, count: int | None) -> Iterator:
        """This rank's batches of `split` from global step `start_step` (count None: all), prefetched
        off the training thread where that pays."""
        batches = self.source.batches(split, self.world.rank, self.world.world_size, start_step)
        batches = itertools.islice(batches, count) if count is not None else batches
        if self.device.type != "cpu" and batches_on(self.source, self.device):
            return batches  # made on the device: asynchronous kernels, nothing to pin or hide
        if not prefetch_pays(self.device, self.world.local_world_size):
            return batches
        pin = self.device if self.device.type == "cuda" else None
        return Prefetcher(batches, depth=2, pin_device=pin)  # off the training thread

    def forward(self, batch):
        """model(batch) -> (loss, (loss, logits, labels)), under bf16 autocast if configured."""
        return forward(self.model, self.device, self.settings.trainer.dense_precision == "bf16", batch)

    def train_step(self, batch) -> torch.Tensor | None:
        """One step without the pipeline: forward, backward (fused embedding update), dense step.

        The batch's copy to the device does not block the host (a pinned batch's copy runs
        asynchronously; an unpinned one is staged as a blocking copy would be).

        With trainer.on_nonfinite=skip, a batch whose loss is not finite on any rank is dropped by
        every rank before its backward pass (nothing is updated): one wait for the device per step.

        Returns:
            The step's loss (0-d, detached), or None for a skipped batch.
        """
        with record_function("## zero_grad ##"):
            self.optimizer.zero_grad()
        with record_function("## copy_batch_to_gpu ##"):
            batch = batch.to(self.device, non_blocking=True)
        with record_function("## forward ##"):
            loss, _ = self.forward(batch)
        if self.settings.trainer.on_nonfinite == "skip":
            finite = torch.isfinite(loss.detach()).float().reshape(1)
            dist.all_reduce(finite, op=dist.ReduceOp.MIN, group=self.pg)
            if finite.item() == 0.0:
                self.skipped_steps.append(self.step + 1)
                return None
        with record_function("## backward ##"):
            loss.backward()
        with record_function("## optimizer ##"):
            self.optimizer.step()
        return loss.detach()

    def step_once(self, batches: Iterator) -> torch.Tensor | None:
        """One training step (labelled STEP_RANGE for the profiler), then the lr of the next; its
        loss (None: skipped). With trainer.sync_every_step the host waits for the device's work."""
        with record_function(STEP_RANGE):
            if self.pipeline is not None:
                loss = self.pipeline.progress(batches)[0]
            else:
                with record_function("## next_batch ##"):
                    batch = next(batches)
                loss = self.train_step(batch)
            if self.settings.trainer.sync_every_step:
                self.sync()
        if loss is None:  # skipped: the optimizer did not step, the schedule still moves with the step
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
                self.schedule.step()
        else:
            self.schedule.step()
        return loss

    def detached_model(self) -> torch.nn.Module:
        """The model with its plain forward (the pipeline's rewrite undone), for direct calls."""
        return self.pipeline.detach() if self.pipeline is not None else self.model

    def _period_batches(self) -> dict[str, Iterator] | None:
        """Each evaluated period's batches (data.eval_batches of each at most; periods under one batch
        left out); None for a source without periods."""
        cap, source = self.settings.eval_batches, self.source
        if not isinstance(source, PositionedSource) or not source.eval_periods:
            return None
        return {
            p: itertools.islice(source.period_batches(p, self.world.rank, self.world.world_size), cap)
            for p in source.eval_periods
            if source.period_batch_count(p)
        }

    def eval_batches(self) -> int:
        """The batches an evaluation scores (`eval_batch_count`: data.eval_batches, or all the eval split has)."""
        return eval_batch_count(self.settings.eval_batches, self.source.num_batches("eval"))

    def evaluate(self) -> dict:
        """AUC and log loss over the eval split ({} if there is none), the same on every rank. The
        pipeline's model, detached for the evaluation's direct calls, is attached again after it
        (TorchRec's public `attach`; PrefetchTrainPipelineSparseDist.progress does not re-attach). Its
        lookups lock no UVM cache line (`cache_lines_unlocked`: only a backward would unlock them)."""
        n = self.eval_batches()
        if not n:
            return {}
        try:
            with cache_lines_unlocked(self.model):
                periods = self._period_batches()
                if periods is not None:  # a dataset partitioned by time: per period
                    return self.evaluator.evaluate_periods(self.detached_model(), periods)
                return self.evaluator.evaluate(self.detached_model(), self.batches("eval", 0, n))
        finally:
            if self.pipeline is not None:
                self.pipeline.attach()
