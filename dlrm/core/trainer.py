"""The trainer: build (topology -> model -> sharding -> optimizers), train, evaluate, summarise."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist

from dlrm.config import Config
from dlrm.core import console
from dlrm.core.cadence import Every, ThroughputWindow
from dlrm.core.checkpoint import Checkpointer, CheckpointError, latest_checkpoint, model_signature, step_tensor
from dlrm.core.dense_sync import use_compressed_allreduce, use_hierarchical_allreduce
from dlrm.core.host_memory import keep_freed_memory
from dlrm.core.local_sgd import LocalSGD
from dlrm.core.logs import JOB_START
from dlrm.core.memory import dense_param_count
from dlrm.core.metrics import MetricsLog, Progress, peak_rss_mb, score_on_rank0
from dlrm.core.model import build_model, compile_dense, initialize
from dlrm.core.optim import LRSchedule, build_optimizer, fuse_embedding_optimizer, lr_factor
from dlrm.core.phases import STEP_RANGE
from dlrm.core.profiling import StepProfiler
from dlrm.core.sharding import describe_plan, plan_sharding, shard_model
from dlrm.core.stop import StopRequest, TrainingStopped
from dlrm.core.topology import (
    World,
    backend_for,
    build_process_groups,
    device_for,
    init_distributed,
    planner_topology,
    synchronizer,
)
from dlrm.data.loader import batches_on, make_source
from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.errors import UserError
from dlrm.io import write_json_atomic

log = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN or infinite loss; the message names the steps and the last checkpoint."""

    same_on_all_ranks = True  # the loss is the global mean


@dataclass
class _Run:
    """What one call of `Trainer.train` carries from step to step."""

    log: MetricsLog
    progress: Progress
    first_step: int
    window: ThroughputWindow = field(default_factory=ThroughputWindow)
    started: float = field(default_factory=time.perf_counter)
    evaluation: dict = field(default_factory=dict)
    target_step: int | None = None  # the step whose evaluation reached trainer.target_auc
    stop_signal: int | None = None  # a signal some rank got, learnt at a log step (dlrm.core.stop)

    @classmethod
    def start(cls, trainer: Trainer) -> _Run:
        run_dir, tr = trainer.run_dir, trainer.cfg.trainer
        metrics = MetricsLog(
            run_dir / "metrics.jsonl" if run_dir else None,
            run_dir / "tensorboard" if run_dir and tr.tensorboard else None,
        )
        # Each invocation's records start with this one: a continuation repeats the steps after its checkpoint.
        metrics.write("run", step=trainer.step, event="start", resumed=trainer.step > 0)
        progress = Progress(trainer.total_steps, tr.progress, trainer.world.is_main, first_step=trainer.step)
        return cls(metrics, progress, trainer.step, ThroughputWindow(sync=trainer.sync))


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
    """

    def __init__(
        self,
        cfg: Config,
        world: World,
        run_dir: Path | None = None,
        summary_extras: Callable[[Trainer, dict], dict] | None = None,
    ) -> None:
        self.cfg = cfg
        self.world = world
        self.summary_extras = summary_extras
        self.run_dir = run_dir if world.is_main else None
        keep_freed_memory()  # the host blocks a step frees stay for the next: no page faults each step
        self.device = device_for(cfg.topology, world, tf32=cfg.trainer.tf32)
        self.sync = synchronizer(self.device)  # the clocks' wait for the device: at log windows, never per step
        self.source = make_source(cfg, self.device)  # data errors before any process group or table exists
        self.pg = init_distributed(cfg.topology, world, self.device, cfg.trainer.collective_timeout_s)

        model = build_model(cfg.model)
        if cfg.trainer.compile_dense:
            compile_dense(model)
        self.dense_params = dense_param_count(model)
        fuse_embedding_optimizer(model, cfg.optim.embedding)
        topology = planner_topology(cfg.topology, world.world_size, world.local_world_size)
        self.plan = plan_sharding(cfg, model, topology, self.pg)
        self.model = shard_model(cfg, model, self.plan, self.pg, self.device)
        tr = cfg.trainer
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
        self.schedule = LRSchedule(self.optimizer, cfg.optim.schedule)
        pipeline = PrefetchTrainPipelineSparseDist if cfg.sharding.prefetch_pipeline else TrainPipelineSparseDist
        self.pipeline = (
            pipeline(self.model, self.optimizer, self.device, custom_model_fwd=self._forward)
            if cfg.trainer.pipeline
            else None
        )
        self.step = 0
        self.stop = StopRequest()  # SIGINT / SIGTERM: a clean stop at the next log step
        self.losses: list[float] = []  # the global mean loss of every logged window; summary's final_loss
        self.skipped_steps: list[int] = []  # steps dropped for a non-finite loss (on_nonfinite=skip)
        # The loop's components and their cadences.
        tr, ck = cfg.trainer, cfg.checkpoint
        self.log_every, self.eval_every = Every(tr.log_every_steps), Every(tr.eval_every_steps)
        trace_dir = self.run_dir / "profile" if self.run_dir is not None else None  # rank 0 traces
        self.profiler = StepProfiler(tr, self.log_every, self.device, self.pg, world.world_size, trace_dir, self.sync)
        root = ck.dir or (run_dir / "checkpoints" if run_dir is not None else None)
        self.checkpointer = (
            Checkpointer(Path(root), ck.keep, self.pg, world.is_main, every=Every(ck.every_steps, ck.at_end))
            if root is not None
            else None
        )
        if cfg.trainer.resume:
            self.resume(cfg.trainer.resume)

    def _checkpoint_state(self) -> dict:
        """What a checkpoint holds: live tensors only (DCP saves them, and loads into them in place).

        Optimizer hyper-parameters are not saved: they come from the config, the lr from the step.
        The manifest names the optimizers, so a resume with other ones is refused.
        """
        state = {"model": self.model.state_dict(), "progress": {"step": step_tensor(self.step)}}
        # Stateless optimizers (SGD) have empty entries: DCP saves no key for them and then cannot
        # find one on load, so only parameters with state go in.
        optim = {name: s for name, s in self.optimizer.state_dict()["state"].items() if s}
        if optim:
            state["optim"] = {"state": optim}
        return state

    def _manifest(self) -> dict:
        return {
            "world_size": self.world.world_size,
            "sharding_plan": describe_plan(self.plan),
            "model": model_signature(self.cfg.model),
            "optim": self._optimizer_names(),
            "config_sha256": hashlib.sha256(json.dumps(asdict(self.cfg), sort_keys=True).encode()).hexdigest(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def _optimizer_names(self) -> dict:
        return {"embedding": self.cfg.optim.embedding.name, "dense": self.cfg.optim.dense.name}

    def save_checkpoint(self) -> Path:
        """Checkpoint the current step (all ranks call it); returns the checkpoint's directory."""
        if self.checkpointer is None:
            raise CheckpointError("no checkpoint directory: set checkpoint.dir or give the trainer a run dir")
        return self.checkpointer.save(self.step, self._checkpoint_state(), self._manifest())

    def resume(self, where: str) -> None:
        """Load model, optimizer state and step from `where`: "auto" (the newest complete checkpoint
        in the checkpoint directory; nothing if there is none) or a checkpoint directory."""
        if where == "auto":
            path = latest_checkpoint(self.checkpointer.root) if self.checkpointer is not None else None
            if path is None:
                log.info("resume=auto: no checkpoint yet, starting from step 0")
                return
        else:
            path = Path(where)
        loader = self.checkpointer or Checkpointer(path.parent, self.cfg.checkpoint.keep, self.pg, self.world.is_main)
        self.optimizer.init_state()  # lazily created state (Adam's) must exist to be loaded into
        state = self._checkpoint_state()
        expected = {"model": model_signature(self.cfg.model), "optim": self._optimizer_names()}
        if self.cfg.trainer.eval_only:  # evaluation needs the weights only, whatever the optimizers
            state.pop("optim", None)
            expected.pop("optim")
        loader.load(path, state, expected, verify=self.cfg.checkpoint.verify)
        self.step = int(state["progress"]["step"].item())
        if self.step > self.total_steps and not self.cfg.trainer.eval_only:
            raise CheckpointError(
                f"checkpoint {path} is at step {self.step}, past trainer.max_steps={self.total_steps}: raise "
                "trainer.max_steps to train on from it, or evaluate it with trainer.eval_only=true"
            )
        if self.local_sgd is not None:
            self.local_sgd.at(self.step)
        log.info(f"resumed from {path} at step {self.step}")

    @property
    def total_steps(self) -> int:
        """Steps to train: trainer.max_steps, or fewer if trainer.max_samples comes first."""
        tr = self.cfg.trainer
        steps = tr.max_steps
        if tr.max_samples is not None:
            steps = min(steps, max(1, tr.max_samples // self.cfg.data.global_batch_size))
        return steps

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

        With trainer.on_nonfinite=skip, a batch whose loss is not finite on any rank is dropped by
        every rank before its backward pass (nothing is updated); returns None then.
        """
        with record_function("## zero_grad ##"):
            self.optimizer.zero_grad()
        with record_function("## copy_batch_to_gpu ##"):
            batch = batch.to(self.device)
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
        """One training step at this step's learning rate, labelled STEP_RANGE for the profiler; its
        loss (None: skipped)."""
        self.schedule.apply(self.step)
        with record_function(STEP_RANGE):
            if self.pipeline is not None:
                loss = self.pipeline.progress(batches)[0]
            else:
                with record_function("## next_batch ##"):
                    batch = next(batches)
                loss = self.train_step(batch)
        return loss

    def _announce(self) -> None:
        """Log the run's configuration and sharding plan (rank 0)."""
        if not self.world.is_main:
            return
        world, backend = self.world, backend_for(self.cfg.topology)
        nodes = world.world_size // world.local_world_size
        lines = console.config_lines(
            self.cfg,
            nodes,
            world.local_world_size,
            backend,
            self.device.type,
            self.dense_params,
            self.total_steps,
            self.eval_batches(),
        ) + console.plan_lines(describe_plan(self.plan), world.world_size, backend)
        for line in lines:
            log.info(line)

    def train(self) -> dict:
        """Train for `total_steps`. Each component acts at its own cadence, and at the last step:
        the log window (trainer.log_every_steps), evaluation (trainer.eval_every_steps), checkpoints
        (checkpoint.every_steps), the step profiler; the throughput clock pauses while they work."""
        self._announce()
        if self.cfg.trainer.eval_only:
            return self._finish(0, 0.0, 0.0, self.evaluate(), None)
        run = _Run.start(self)
        batches = self.batches("train", self.step, self.total_steps - self.step)
        self.model.train()
        self.stop.install(lambda: self.step)
        try:
            return self._loop(run, batches)
        finally:
            self.stop.uninstall()

    def _loop(self, run: _Run, batches: Iterator) -> dict:
        """The steps of `train`, from self.step to total_steps (or a stop: target AUC, a signal)."""
        while self.step < self.total_steps:
            last = self.step + 1 == self.total_steps
            run.window.add(self.profiler.step(self.step + 1, last, lambda: self.step_once(batches)))
            self.step += 1
            if last and self.local_sgd is not None and not self.local_sgd.averaged(self.step):
                self.local_sgd.average()  # the run's model: the ranks' average
            if self.log_every.due(self.step, last) and run.window.losses:
                self._log_window(run, last)
            if run.stop_signal is not None:
                self._stop(run, run.stop_signal)
            reached = False
            with run.window.paused():
                if self.eval_every.due(self.step, last):
                    run.evaluation = self._evaluate_and_log(run)
                    reached = self._target_reached(run)
            if reached and not last:  # the run ends here: close the log window as at the last step
                last = True
                if run.window.losses:
                    self._log_window(run, last)
            with run.window.paused():
                if self.checkpointer is not None:
                    saved = self.checkpointer.maybe_save(self.step, last, self._checkpoint_state, self._manifest)
                    if saved is not None:
                        run.progress.message(f"checkpoint: {saved}")
            if reached:
                self.profiler.stop_trace()
                break
        return self._end(run)

    def _stop(self, run: _Run, signum: int) -> None:
        """End the run at this log step because some rank got `signum` (dlrm.core.stop): every rank is
        here at the same step. Save a checkpoint with checkpoint.on_signal (or where one is due), close
        the logs, raise TrainingStopped naming the step, the last checkpoint and how to continue."""
        self.stop.stopping = True
        ck = self.cfg.checkpoint
        if self.checkpointer is not None and (ck.on_signal or self.checkpointer.every.due(self.step, False)):
            run.progress.message(f"checkpoint: {self.save_checkpoint()}")
        self.profiler.stop_trace()
        run.progress.close()
        run.log.close()
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

    def _target_reached(self, run: _Run) -> bool:
        """Whether this evaluation reached trainer.target_auc (every rank holds rank 0's figures, see
        `evaluate`, so all stop at the same step); the first time, record the step and samples to target."""
        target = self.cfg.trainer.target_auc
        auc = run.evaluation.get("auc")
        if target is None or run.target_step is not None or auc is None or auc < target:
            return False
        run.target_step = self.step
        samples = self.step * self.cfg.data.global_batch_size
        run.progress.message(
            f"target AUC {target} reached at step {self.step} ({samples:,} samples): auc {auc:.5f}; stopping"
        )
        return True

    def _log_window(self, run: _Run, last: bool) -> None:
        """The window's global mean loss (a NaN or inf stops the run), throughput and step breakdown,
        to metrics.jsonl, TensorBoard and the progress display. A collective: every rank calls it."""
        losses, _, seconds = run.window.close()
        mean_loss, run.stop_signal = self._global_mean(losses)
        if not math.isfinite(mean_loss):
            latest = latest_checkpoint(self.checkpointer.root) if self.checkpointer else None
            raise NonFiniteLossError(
                f"loss is {mean_loss} in steps {self.step - len(losses) + 1}..{self.step}; "
                f"last good checkpoint: {latest or 'none'}. Either the training diverged (lower "
                "optim.embedding.lr / optim.dense.lr and resume from it with trainer.resume=auto) or "
                "the input holds NaN/inf values (check the data files; a Criteo loader refuses them "
                "when it verifies them); trainer.log_every_steps=1 stops sooner"
            )
        self.losses.append(mean_loss)
        lr = lr_factor(self.step - 1, self.cfg.optim.schedule) * self.cfg.optim.dense.lr
        samples_per_s = len(losses) * self.cfg.data.global_batch_size / seconds
        record: dict[str, Any] = dict(
            step=self.step,
            loss=mean_loss,
            lr=lr,
            samples_per_s=samples_per_s,
            step_s=seconds / len(losses),
            peak_rss_mb=peak_rss_mb(),
        )
        if self.device.type == "cuda":
            record["peak_gpu_mem_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        warm_up = self.step - run.first_step <= self.cfg.trainer.log_every_steps
        record.update(self.profiler.window_record(warm_up, last))
        run.log.write(**record)
        run.progress.update(self.step, len(losses), loss=mean_loss, lr=lr, samples_per_s=samples_per_s)

    def _evaluate_and_log(self, run: _Run) -> dict:
        evaluation = self.evaluate()
        run.log.write("eval", step=self.step, **{f"eval_{k}": v for k, v in evaluation.items()})
        run.progress.message(f"eval at step {self.step}: {console.eval_text(evaluation)}")
        return evaluation

    def _end(self, run: _Run) -> dict:
        """Close the run's outputs; the summary (see `_finish`)."""
        if run.first_step >= self.total_steps:  # resumed at the end: nothing to train, still report the model
            run.evaluation = self.evaluate()
        run.progress.close()
        breakdown = self.profiler.run_record()
        if breakdown is not None:
            run.log.write("run", step=self.step, **{f"run_{k}": v for k, v in breakdown.items()})
        run.log.close()
        wall = time.perf_counter() - run.started
        return self._finish(
            self.step - run.first_step, run.window.train_seconds, wall, run.evaluation, breakdown, run.target_step
        )

    def _finish(
        self,
        steps: int,
        train_seconds: float,
        wall_seconds: float,
        evaluation: dict,
        breakdown: dict | None,
        target_step: int | None = None,
    ) -> dict:
        """The summary of the run: written to summary.json and its closing lines logged (rank 0)."""
        summary = self._summary(steps, train_seconds, wall_seconds, evaluation)
        target = self.cfg.trainer.target_auc
        if target is not None:
            batch = self.cfg.data.global_batch_size
            summary["target_auc"] = target
            summary["reached_target"] = target_step is not None
            summary["steps_to_target"] = target_step
            summary["samples_to_target"] = target_step * batch if target_step is not None else None
        if breakdown is not None:
            summary["step_breakdown"] = breakdown
        if self.summary_extras is not None:
            summary.update(self.summary_extras(self, summary))
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / "summary.json", summary)
        if self.world.is_main:
            lines = console.end_lines(
                summary,
                self.cfg.data.global_batch_size,
                self.world.world_size,
                self.run_dir,
                self.cfg.trainer.tensorboard,
            )
            for line in lines:
                log.info(line)
        return summary

    def detached_model(self) -> torch.nn.Module:
        """The model with its plain forward (the pipeline's rewrite undone), for direct calls."""
        return self.pipeline.detach() if self.pipeline is not None else self.model

    def eval_batches(self) -> int:
        """The batches an evaluation scores: data.eval_batches, or fewer if the eval split holds fewer (0: none)."""
        available = self.source.num_batches("eval")
        n = self.cfg.data.eval_batches
        return n if available is None else min(n, available)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """AUC and log loss over the eval split ({} if there is none): every rank scores its slice,
        rank 0 computes the figures on the training device (`score_on_rank0`), every rank returns them."""
        n = self.eval_batches()
        if not n:
            return {}
        model = self.detached_model()
        model.eval()
        logits, labels = [], []
        for batch in self.batches("eval", 0, n):
            _, (_, batch_logits, batch_labels) = self._forward(batch.to(self.device))
            logits.append(batch_logits)
            labels.append(batch_labels)
        model.train()
        return score_on_rank0(torch.stack((torch.cat(logits).float(), torch.cat(labels).float())), self.pg)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-sized tensors [N] from every rank, in rank order -> [W * N]."""
        parts = [torch.empty_like(t) for _ in range(self.world.world_size)]
        dist.all_gather(parts, t, group=self.pg)
        return torch.cat(parts).cpu()

    def _global_mean(self, losses: list[torch.Tensor]) -> tuple[float, int | None]:
        """Mean over steps and ranks of per-rank losses (each rank's loss is over its slice), and the
        stop signal any rank got (dlrm.core.stop; SIGTERM before SIGINT), in one all-reduce."""
        total = torch.stack(losses).sum().float()
        mine = self.stop.signum
        flags = [float(mine == signal.SIGTERM), float(mine == signal.SIGINT)]
        figures = torch.cat([total.reshape(1), total.new_tensor(flags)])
        dist.all_reduce(figures, group=self.pg)
        loss, term, interrupt = figures.tolist()
        signum = signal.SIGTERM if term else signal.SIGINT if interrupt else None
        return loss / (len(losses) * self.world.world_size), signum

    def _summary(self, steps: int, train_seconds: float, wall_seconds: float, evaluation: dict) -> dict:
        """The run's summary.json; `steps` were trained in `train_seconds` by this process."""
        peak = torch.tensor([peak_rss_mb()], dtype=torch.float64)
        peaks = self._gather(peak.to(self.device)).tolist()
        return {
            "world_size": self.world.world_size,
            "backend": backend_for(self.cfg.topology),
            "device": str(self.device.type),
            "topology": self.cfg.topology.name,
            "sharding_plan": describe_plan(self.plan),
            "steps": self.step,
            "global_batch_size": self.cfg.data.global_batch_size,
            "train_samples_per_s": steps * self.cfg.data.global_batch_size / train_seconds if steps else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "skipped_steps": self.skipped_steps,
            "eval_auc": evaluation.get("auc"),
            "eval_logloss": evaluation.get("logloss"),
            "wall_time_s": wall_seconds,
            "job_wall_time_s": time.monotonic() - JOB_START,
            "peak_rss_mb_per_rank": peaks,
        }
