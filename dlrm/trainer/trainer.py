# long file: the trainer builds and drives every loop component; split, it would only move wiring
"""The trainer: build (topology -> model -> sharding -> optimizers), then train at each component's
cadence: the log window (dlrm.trainer.reporter), evaluation (dlrm.trainer.evaluator), checkpoints of the
train state (dlrm.trainer.train_state, dlrm.checkpoint), the step profiler."""

from __future__ import annotations

import itertools
import logging
import math
import signal
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist

from dlrm.checkpoint import Checkpointer, CheckpointError, latest_checkpoint
from dlrm.common.cadence import Every
from dlrm.common.errors import UserError
from dlrm.config import Config
from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.data.source import PositionedSource, batches_on, make_source
from dlrm.deltas.publish import Publisher
from dlrm.distributed.cache_locks import cache_lines_unlocked
from dlrm.distributed.capacity import dense_param_count
from dlrm.distributed.dense_sync import use_compressed_allreduce, use_hierarchical_allreduce
from dlrm.distributed.local_sgd import LocalSGD
from dlrm.distributed.sharding import describe_plan, plan_sharding, shard_model
from dlrm.distributed.topology import (
    build_process_groups,
    device_for,
    init_distributed,
    planner_topology,
    synchronizer,
)
from dlrm.distributed.world import World
from dlrm.models.dlrm import DLRMTrain, build_model, compile_dense, initialize
from dlrm.models.vocabulary import vocabulary_metrics
from dlrm.optim.optimizers import build_optimizer, fuse_embedding_optimizer, lr_factor, lr_schedule
from dlrm.run.records import planned_steps, recorded_config_sha256
from dlrm.trainer.evaluator import Evaluator, eval_batch_count
from dlrm.trainer.malloc import keep_freed_memory
from dlrm.trainer.phases import STEP_RANGE
from dlrm.trainer.profiler import StepProfiler
from dlrm.trainer.reporter import Reporter, global_mean_and_signal
from dlrm.trainer.stop import StopRequest, TrainingStopped
from dlrm.trainer.threads import apply_intra_op_threads
from dlrm.trainer.train_state import TrainState

log = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN or infinite loss; the message names the steps and the last checkpoint."""

    same_on_all_ranks = True  # the loss is the global mean


class Trainer:
    """One rank's share of a DLRM training job.

    Args:
        cfg: a validated config (`dlrm.config.validate`, `validate_world`).
        world: this process's rank and the launcher's sizes.
        run_dir: the run directory (the same on every rank): rank 0 writes metrics.jsonl and
            summary.json there, and checkpoints go to run_dir/checkpoints unless checkpoint.dir is
            set. None: no files, and no checkpoints unless checkpoint.dir is set.
        summary_extras: (trainer, summary) -> more summary entries, computed outside the core before
            summary.json is written (dlrm.train passes dlrm.comms.measured's comm_vs_model).
        model: the unsharded model (`build_model(cfg.model)`, on the meta device) if the caller built
            it already (dlrm.train does, for the memory check); None: built here.

    Public seams: `batches`, `step_once`, `evaluate`, `save_checkpoint`, and `source` (the batch
    source, replaceable before `train`: the bench caches it, tests inject faults into it).
    """

    def __init__(
        self,
        cfg: Config,
        world: World,
        run_dir: Path | None = None,
        summary_extras: Callable[[Trainer, dict], dict] | None = None,
        model: DLRMTrain | None = None,
    ) -> None:
        self.cfg, self.world, self.summary_extras = cfg, world, summary_extras
        self.run_dir = run_dir if world.is_main else None
        keep_freed_memory()  # the host blocks a step frees stay for the next: no page faults each step
        apply_intra_op_threads(cfg.trainer.intra_op_threads, world.local_world_size)  # no oversubscribed cores
        self.device = device_for(cfg.topology, world, tf32=cfg.trainer.tf32)
        self.sync = synchronizer(self.device)  # the clocks' wait for the device: at log windows, not per step
        self.source = make_source(cfg, self.device)  # data errors before any process group or table exists
        self.pg = init_distributed(cfg.topology, world, self.device, cfg.trainer.collective_timeout_s)
        self._build(model if model is not None else build_model(cfg.model))
        tr, ck = cfg.trainer, cfg.checkpoint
        self.stop = StopRequest(world.is_main)  # SIGINT/SIGTERM/SIGHUP: a clean stop at the next log step
        self.skipped_steps: list[int] = []  # steps dropped for a non-finite loss (on_nonfinite=skip)
        self.reporter = Reporter(cfg, world, self.device, self.pg, self.run_dir)
        self.state = TrainState(
            cfg,
            self.model,
            self.optimizer,
            world.world_size,
            self.plan,
            recorded_config_sha256(self.run_dir),
            self.reporter.run_time,
        )
        if isinstance(self.source, PositionedSource):  # a Parquet source records the rows each step read
            self.state.data_position = self._data_position
        self.evaluator = Evaluator(cfg, self.device, self.pg)
        trace_dir = self.run_dir / "profile" if self.run_dir is not None else None  # rank 0 traces
        self.profiler = StepProfiler(tr, self.device, self.pg, world.world_size, trace_dir, self.sync)
        root = ck.dir or (run_dir / "checkpoints" if run_dir is not None else None)
        self.checkpointer = (
            Checkpointer(
                Path(root),
                ck.keep,
                self.pg,
                world.is_main,
                every=Every(ck.every_steps, ck.at_end),
                background=ck.async_save and ck.every_steps > 0,  # periodic saves only: the last waits anyway
            )
            if root is not None
            else None
        )
        deltas_root = cfg.deltas.dir or (run_dir / "deltas" if run_dir is not None else None)
        self.deltas = (
            Publisher(cfg.model, Path(deltas_root), cfg.deltas.every_steps, cfg.deltas.at_end, self.pg, world.is_main)
            if cfg.deltas.every_steps and deltas_root is not None
            else None
        )
        if tr.resume:
            self.resume(tr.resume)
        self.schedule = lr_schedule(self.optimizer, cfg.optim.schedule, self.step, self.schedule_origin)

    def _build(self, model: DLRMTrain) -> None:
        """Shard `model` by the plan, hook the dense synchronisation, initialise, make the optimizers
        and the pipeline: self.plan, self.model, self.optimizer, self.local_sgd, self.pipeline."""
        cfg, world, tr = self.cfg, self.world, self.cfg.trainer
        if tr.compile_dense:
            compile_dense(model)
        self.dense_params = dense_param_count(model)
        fuse_embedding_optimizer(model, cfg.optim.embedding)
        topology = planner_topology(cfg.topology, world.world_size, world.local_world_size)
        self.plan = plan_sharding(cfg, model, topology, self.pg)
        self.model = shard_model(cfg, model, self.plan, self.pg, self.device)
        precision = tr.dense_allreduce_precision
        if tr.dense_allreduce == "hierarchical":  # the node x local groups exist only for it
            groups = build_process_groups(
                self.device, world.world_size // world.local_world_size, world.local_world_size
            )
            if not use_hierarchical_allreduce(self.model, groups, precision):
                raise RuntimeError("trainer.dense_allreduce=hierarchical, but the model has no DDP module to hook")
        elif precision != "fp32" and not use_compressed_allreduce(self.model, precision, self.pg):
            raise RuntimeError(f"trainer.dense_allreduce_precision={precision}, but the model has no DDP module")
        self.local_sgd = (
            LocalSGD(tr.sync_period, tr.local_sgd_warmup_steps, self.pg) if tr.dense_sync == "local_sgd" else None
        )
        if self.local_sgd is not None:
            self.local_sgd.hook(self.model)
        initialize(self.model, cfg.model, cfg.seed)
        self.optimizer = build_optimizer(self.model, self.model.fused_optimizer, cfg.optim, self.local_sgd)
        if self.local_sgd is not None:
            self.local_sgd.check_covered(self.model)
        pipeline = PrefetchTrainPipelineSparseDist if cfg.sharding.prefetch_pipeline else TrainPipelineSparseDist
        self.pipeline = (
            pipeline(self.model, self.optimizer, self.device, custom_model_fwd=self._forward) if tr.pipeline else None
        )

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

    def save_checkpoint(self, background: bool = False) -> Path:
        """Checkpoint the current step (all ranks call it); returns the checkpoint's directory. background
        (with checkpoint.async_save): returns once the state is staged on the host, the files follow
        (`Checkpointer.save`); the next save, a clean stop and the run's end wait for them."""
        if self.checkpointer is None:
            raise CheckpointError("no checkpoint directory: set checkpoint.dir or give the trainer a run dir")
        return self.checkpointer.save(self.step, self.state.state_dict(), self.state.manifest(), background)

    def resume(self, where: str) -> None:
        """Load model, optimizer state and step from `where`: "auto" (the newest complete checkpoint
        in the checkpoint directory; nothing if there is none) or a checkpoint directory. With
        trainer.eval_only the weights only, whatever the optimizers."""
        if where == "auto":
            path = latest_checkpoint(self.checkpointer.root) if self.checkpointer is not None else None
            if path is None:
                log.info("resume=auto: no checkpoint yet, starting from step 0")
                return
        else:
            path = Path(where)
        loader = self.checkpointer or Checkpointer(path.parent, self.cfg.checkpoint.keep, self.pg, self.world.is_main)
        self.optimizer.init_state()  # lazily created state (Adam's) must exist to be loaded into
        weights_only = self.cfg.trainer.eval_only
        state = self.state.state_dict(weights_only)
        manifest = loader.load(path, state, self.state.expected(weights_only), verify=self.cfg.checkpoint.verify)
        self.state.load_state_dict(state)
        self.reporter.run_time.carry(manifest.get("run_time"), self.step)
        if isinstance(self.source, PositionedSource) and not weights_only:
            continuation = self.source.resume_position(manifest.get("data_position"), self.step, str(path))
            if continuation is not None:
                log.info(continuation)
        if self.step > self.total_steps and not weights_only:
            raise CheckpointError(
                f"checkpoint {path} is at step {self.step}, past trainer.max_steps={self.total_steps}: raise "
                "trainer.max_steps to train on from it, or evaluate it with trainer.eval_only=true"
            )
        if self.local_sgd is not None:
            self.local_sgd.at(self.step)
        log.info(f"resumed from {path} at step {self.step}")

    @property
    def schedule_origin(self) -> int:
        """The step the lr schedule's clock starts at: 0, or with optim.schedule.on_new_data=restart
        the first step of the continuation over new data that this run's stream began at."""
        if self.cfg.optim.schedule.on_new_data == "restart" and isinstance(self.source, PositionedSource):
            return self.source.stream_start
        return 0

    @property
    def total_steps(self) -> int:
        """Steps to train: trainer.max_steps, or fewer if trainer.max_samples comes first; with
        trainer.max_epochs, the step where that many passes over the training window end."""
        tr = self.cfg.trainer
        if tr.max_epochs is not None and isinstance(self.source, PositionedSource):  # validated: Parquet
            return self.source.steps_for_passes(tr.max_epochs)
        return planned_steps(tr.max_steps, tr.max_samples, self.cfg.data.global_batch_size)

    def batches(self, split: str, start_step: int, count: int | None) -> Iterator:
        """This rank's batches of `split` from global step `start_step` (count None: all), prefetched
        off the training thread where that pays (dlrm.data.prefetch)."""
        batches = self.source.batches(split, self.world.rank, self.world.world_size, start_step)
        batches = itertools.islice(batches, count) if count is not None else batches
        if self.device.type != "cpu" and batches_on(self.source, self.device):
            return batches  # made on the device: asynchronous kernels, nothing to pin or hide
        if not prefetch_pays(self.device, self.world.local_world_size):
            return batches
        pin = self.device if self.device.type == "cuda" else None
        return Prefetcher(batches, depth=2, pin_device=pin)  # off the training thread

    def _forward(self, batch):
        """model(batch) -> (loss, (loss, logits, labels)), under bf16 autocast if configured."""
        bf16 = self.cfg.trainer.dense_precision == "bf16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            return self.model(batch)

    def train_step(self, batch) -> torch.Tensor | None:
        """One step without the pipeline: forward, backward (fused embedding update), dense step.

        The batch's copy to the device does not block the host (a pinned batch's copy runs
        asynchronously; an unpinned one is staged as a blocking copy would be).

        With trainer.on_nonfinite=skip, a batch whose loss is not finite on any rank is dropped by
        every rank before its backward pass (nothing is updated); returns None then. That decision
        is this option's one wait for the device per step, and no device-side mask can replace it:
        the fused embedding update runs inside the backward pass and cannot be undone, a NaN
        activation makes every gradient behind it NaN (0 x NaN = NaN), and a stateful optimizer
        (Adam's moments) moves on a zero gradient too.
        """
        with record_function("## zero_grad ##"):
            self.optimizer.zero_grad()
        with record_function("## copy_batch_to_gpu ##"):
            batch = batch.to(self.device, non_blocking=True)
        with record_function("## forward ##"):
            loss, _ = self._forward(batch)
        if self.cfg.trainer.on_nonfinite == "skip":
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
            if self.cfg.trainer.sync_every_step:
                self.sync()
        if loss is None:  # skipped: the optimizer did not step, the schedule still moves with the step
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
                self.schedule.step()
        else:
            self.schedule.step()
        return loss

    def train(self) -> dict:
        """Train for `total_steps`. Each component acts at its own cadence, and at the last step:
        the log window (trainer.log_every_steps), evaluation (trainer.eval_every_steps), checkpoints
        (checkpoint.every_steps), the step profiler; the throughput clock pauses while they work.
        With trainer.eval_only, evaluate the resumed model instead. Returns the summary."""
        self.reporter.announce(describe_plan(self.plan), self.dense_params, self.total_steps, self.eval_batches())
        self.reporter.open(self.step, self.total_steps, self.sync)
        if self.cfg.trainer.eval_only:
            evaluation = self.evaluate()
            self.reporter.evaluation(self.step, evaluation)
            return self._end(evaluation, None)
        batches = self.batches("train", self.step, self.total_steps - self.step)
        if self.deltas is not None:  # the ids of each batch taken: the rows its step changes
            self.deltas.start(self.step)
            batches = self.deltas.tracker.watch(batches, self.step)
        self.model.train()
        self.stop.install(lambda: self.step)
        try:
            return self._loop(batches)
        finally:
            self.stop.uninstall()

    def _loop(self, batches: Iterator) -> dict:
        """The steps of `train`, from self.step to total_steps (or a stop: target AUC, a signal).

        A step with no log, evaluation or checkpoint due never waits for the device: the clock is
        paused (a wait) only around an evaluation or a save that is due. The pipeline is fed up to
        the next evaluation's step only, so it has trained every batch it took (none queued, no
        embedding prefetched) when the evaluation detaches the model; it is re-attached after."""
        report, evaluation = self.reporter, {}
        first_step = self.step
        feed = self._until_next_eval(batches)
        while self.step < self.total_steps:
            last = self.step + 1 == self.total_steps
            with self.profiler.step(self.step + 1, last, report.paused):
                loss = self.step_once(feed)
            report.add(loss)
            self.step += 1
            if self.local_sgd is not None and self.local_sgd.due(self.step, last):
                self.local_sgd.average()  # the run's model: the ranks' average
            if report.due(self.step, last):
                self._log_window(last, first_step)
            reached = False
            if self.evaluator.due(self.step, last):
                with report.paused():
                    evaluation = self.evaluate()
                    self.reporter.evaluation(self.step, evaluation)
                    reached = self._reached_target(evaluation)
                feed = self._until_next_eval(batches)
            if reached and not last:  # the run ends here: close the log window as at the last step
                last = True
                if report.due(self.step, last):
                    self._log_window(last, first_step)
            if self.checkpointer is not None and self.checkpointer.due(self.step, last):
                with report.paused():
                    path = self.save_checkpoint(background=not last)
                    in_flight = self.checkpointer.in_flight
                    self.reporter.message(f"checkpoint: {path}{' (writing in the background)' if in_flight else ''}")
            if self.deltas is not None and self.deltas.due(self.step, last):
                with report.paused():
                    published = self.deltas.publish(self.step, self.model)
                    if published is not None:
                        self.reporter.message(f"delta: {published}")
            if reached:
                self.profiler.stop_trace()
                break
        if first_step >= self.total_steps:  # resumed at the end: nothing to train, still report the model
            evaluation = self.evaluate()
        return self._end(evaluation, self.profiler.run_record())

    def _until_next_eval(self, batches: Iterator) -> Iterator:
        """`batches` up to the step of the next evaluation (or the last step): the training
        pipeline runs out of batches there, trains those it holds, and is empty."""
        n, steps = self.evaluator.every.n, self.total_steps
        end = min(steps, (self.step // n + 1) * n) if n > 0 else steps
        return itertools.islice(batches, end - self.step)

    def _reached_target(self, evaluation: dict) -> bool:
        """Whether the run ends at this evaluation: trainer.target_auc reached, or trainer.patience
        evaluations without a better trainer.select_metric."""
        if self.evaluator.stalled(evaluation, self.step):
            best_step, best = self.evaluator.best or (0, math.nan)
            self.reporter.message(
                f"{self.cfg.trainer.select_metric} has not improved on {best:.5f} (step {best_step}) in "
                f"{self.cfg.trainer.patience} evaluation(s): stopping at step {self.step}"
            )
            return True
        if not self.evaluator.reached_target(evaluation, self.step):
            return False
        samples = self.step * self.cfg.data.global_batch_size
        self.reporter.message(
            f"target AUC {self.cfg.trainer.target_auc} reached at step {self.step} ({samples:,} samples): "
            f"auc {evaluation['auc']:.5f}; stopping"
        )
        return True

    def _log_window(self, last: bool, first_step: int) -> None:
        """Close the log window: its global mean loss (a NaN or inf stops the run), throughput and
        step breakdown, reported; a stop signal that any rank got ends the run here. A collective."""
        losses, steps, seconds = self.reporter.window.close()
        mean_loss, signum = global_mean_and_signal(losses, self.stop.signum, self.pg, self.world.world_size)
        if not math.isfinite(mean_loss):
            latest = latest_checkpoint(self.checkpointer.root) if self.checkpointer else None
            raise NonFiniteLossError(
                f"loss is {mean_loss} in steps {self.step - len(losses) + 1}..{self.step}; "
                f"last good checkpoint: {latest or 'none'}. Either the training diverged (lower "
                "optim.embedding.lr / optim.dense.lr and resume from it with trainer.resume=auto) or "
                "the input holds NaN/inf values (check the data files; a Criteo loader refuses them "
                "when it verifies them); trainer.log_every_steps=1 stops sooner"
            )
        lr = lr_factor(self.step - 1 - self.schedule_origin, self.cfg.optim.schedule) * self.cfg.optim.dense.lr
        warm_up = self.step - first_step <= self.cfg.trainer.log_every_steps
        phases = {**self.profiler.window_record(warm_up, last), **vocabulary_metrics(self.model)}  # vocab_<table>_*
        self.reporter.window_record(self.step, mean_loss, len(losses), seconds, lr, phases)
        if signum is not None:
            self._stop(signum)

    def _stop(self, signum: int) -> None:
        """End the run at this log step because some rank got `signum` (dlrm.trainer.stop): every rank is
        here at the same step. Save a checkpoint with checkpoint.on_signal (or where one is due), close
        the logs, raise TrainingStopped naming the step, the last checkpoint and how to continue."""
        self.stop.stopping = True
        ck = self.cfg.checkpoint
        if self.checkpointer is not None and (ck.on_signal or self.checkpointer.due(self.step, False)):
            self.reporter.message(f"checkpoint: {self.save_checkpoint()}")
        if self.checkpointer is not None:
            self.checkpointer.wait()  # a background save completes before the run ends
        self.profiler.stop_trace()
        self.reporter.close(self.step, None)
        latest = latest_checkpoint(self.checkpointer.root) if self.checkpointer is not None else None
        where = f" run.name={self.cfg.run.name}" if self.cfg.run.name else ""
        if not where and self.run_dir is not None:
            where = f" hydra.run.dir={self.run_dir}"
        hint = "" if latest or ck.on_signal else " (checkpoint.on_signal=true saves one at a stop)"
        raise TrainingStopped(
            f"by {signal.Signals(signum).name} at step {self.step} of {self.total_steps}; last checkpoint: "
            f"{latest or 'none'}{hint}; continue with the same command and{where} trainer.resume=auto",
            signum,
        )

    def _end(self, evaluation: dict, breakdown: dict | None) -> dict:
        """Close the records; the summary (summary.json on rank 0, the closing console lines)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()  # a background save completes before the run ends
        self.reporter.close(self.step, breakdown)

        def extras(summary: dict) -> dict:
            more: dict = {"sharding_plan": describe_plan(self.plan), **self.evaluator.target_record()}
            counts = getattr(self.source, "data_counts", None)  # values the reader changed (folded ids, ...)
            if counts is not None and any(counts().values()):
                more["data_counts"] = counts()
                log.warning("data (this rank's reads): %s", ", ".join(f"{k} {v:,}" for k, v in counts().items()))
            if breakdown is not None:
                more["step_breakdown"] = breakdown
            if self.summary_extras is not None:
                more.update(self.summary_extras(self, {**summary, **more}))
            return more

        return self.reporter.summary(self.step, evaluation, self.skipped_steps, extras)

    def detached_model(self) -> torch.nn.Module:
        """The model with its plain forward (the pipeline's rewrite undone), for direct calls."""
        return self.pipeline.detach() if self.pipeline is not None else self.model

    def _data_position(self, step: int) -> dict:
        assert isinstance(self.source, PositionedSource)
        return self.source.position(step)

    def _period_batches(self) -> dict[str, Iterator] | None:
        """Each evaluated period's batches (data.eval_batches of each at most; periods under one batch
        left out); None for a source without periods."""
        cap, source = self.cfg.data.eval_batches, self.source
        if not isinstance(source, PositionedSource) or not source.eval_periods:
            return None
        return {
            p: itertools.islice(source.period_batches(p, self.world.rank, self.world.world_size), cap)
            for p in source.eval_periods
            if source.period_batch_count(p)
        }

    def eval_batches(self) -> int:
        """The batches an evaluation scores (`eval_batch_count`: data.eval_batches, or all the eval split has)."""
        return eval_batch_count(self.cfg, self.source.num_batches("eval"))

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
