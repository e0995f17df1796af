"""The trainer: build (topology -> model -> sharding -> optimizers), train, evaluate, summarise."""

from __future__ import annotations

from dlrm.errors import UserError
import hashlib
import itertools
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from dlrm.checkpoint import Checkpointer, CheckpointError, latest_checkpoint, model_signature, step_tensor
from dlrm.comm_hooks import use_hierarchical_allreduce
from dlrm.config import Config
from dlrm.data.loader import make_source
from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.metrics import MetricsLog, Progress, auc_and_logloss, peak_rss_mb, write_json_atomic
from dlrm.model import build_model, initialize
from dlrm.optim import LRSchedule, build_optimizer, fuse_embedding_optimizer
from dlrm.sharding import describe_plan, plan_sharding, shard_model
from dlrm.topology import (
    World,
    backend_for,
    build_process_groups,
    device_for,
    init_distributed,
    planner_topology,
)


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN or infinite loss; the message names the steps and the last checkpoint."""


class Trainer:
    """One rank's share of a DLRM training job.

    Args:
        cfg: a validated config (`dlrm.config.validate`, `validate_world`).
        world: this process's rank and the launcher's sizes.
        run_dir: the run directory (the same on every rank): rank 0 writes metrics.jsonl and
            summary.json there, and checkpoints go to run_dir/checkpoints unless checkpoint.dir is
            set. None: no files, and no checkpoints unless checkpoint.dir is set.
    """

    def __init__(self, cfg: Config, world: World, run_dir: Optional[Path] = None) -> None:
        self.cfg = cfg
        self.world = world
        self.run_dir = run_dir if world.is_main else None
        self.device = device_for(cfg.topology, world, tf32=cfg.trainer.tf32)
        self.pg = init_distributed(cfg.topology, world)
        self.groups = build_process_groups(self.device, world.world_size // world.local_world_size, world.local_world_size)

        model = build_model(cfg.model)
        fuse_embedding_optimizer(model, cfg.optim.embedding)
        topology = planner_topology(cfg.topology, world.world_size, world.local_world_size)
        self.plan = plan_sharding(cfg, model, topology, self.pg)
        self.model = shard_model(model, self.plan, self.pg, self.device)
        if cfg.trainer.dense_allreduce == "hierarchical" and not use_hierarchical_allreduce(self.model, self.groups):
            raise RuntimeError("trainer.dense_allreduce=hierarchical, but the model has no DDP module to hook")
        initialize(self.model, cfg.model, cfg.seed)
        self.optimizer = build_optimizer(self.model, self.model.fused_optimizer, cfg.optim)
        self.schedule = LRSchedule(self.optimizer, cfg.optim.schedule)
        self.source = make_source(cfg)
        self.pipeline = (
            TrainPipelineSparseDist(self.model, self.optimizer, self.device, custom_model_fwd=self._forward)
            if cfg.trainer.pipeline
            else None
        )
        self.step = 0
        self.losses: List[float] = []  # global mean loss of every logged window, for tests
        self.skipped_steps: List[int] = []  # steps dropped for a non-finite loss (on_nonfinite=skip)
        root = cfg.checkpoint.dir or (run_dir / "checkpoints" if run_dir is not None else None)
        self.checkpointer = (
            Checkpointer(Path(root), cfg.checkpoint.keep, self.pg, world.is_main) if root is not None else None
        )
        if cfg.trainer.resume:
            self.resume(cfg.trainer.resume)

    def _checkpoint_state(self) -> dict:
        """What a checkpoint holds: live tensors only (DCP saves them, and loads into them in place).

        Optimizer hyper-parameters are not saved: they come from the config, the lr from the step.
        """
        return {
            "model": self.model.state_dict(),
            "optim": {"state": self.optimizer.state_dict()["state"]},
            "progress": {"step": step_tensor(self.step)},
        }

    def _manifest(self) -> dict:
        return {
            "world_size": self.world.world_size,
            "sharding_plan": describe_plan(self.plan),
            "model": model_signature(self.cfg.model),
            "config_sha256": hashlib.sha256(json.dumps(asdict(self.cfg), sort_keys=True).encode()).hexdigest(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

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
                if self.world.is_main:
                    print("resume=auto: no checkpoint yet, starting from step 0", flush=True)
                return
        else:
            path = Path(where)
        loader = self.checkpointer or Checkpointer(path.parent, self.cfg.checkpoint.keep, self.pg, self.world.is_main)
        self.optimizer.init_state()  # lazily created state (Adam's) must exist to be loaded into
        state = self._checkpoint_state()
        loader.load(path, state, model_signature(self.cfg.model))
        self.step = int(state["progress"]["step"].item())
        if self.world.is_main:
            print(f"resumed from {path} at step {self.step}", flush=True)

    @property
    def total_steps(self) -> int:
        """Steps to train: trainer.max_steps, or fewer if trainer.max_samples comes first."""
        tr = self.cfg.trainer
        steps = tr.max_steps
        if tr.max_samples is not None:
            steps = min(steps, max(1, tr.max_samples // self.cfg.data.global_batch_size))
        return steps

    def _batches(self, split: str, start_step: int, count: Optional[int]) -> Iterator:
        batches = self.source.batches(split, self.world.rank, self.world.world_size, start_step)
        batches = itertools.islice(batches, count) if count is not None else batches
        if not prefetch_pays(self.device, self.world.local_world_size):
            return batches
        return Prefetcher(batches, depth=2, pin_memory=self.device.type == "cuda")  # off the training thread

    def _forward(self, batch):
        """model(batch) -> (loss, (loss, logits, labels)), under bf16 autocast if configured."""
        bf16 = self.cfg.trainer.dense_precision == "bf16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            return self.model(batch)

    def train_step(self, batch) -> Optional[torch.Tensor]:
        """One step without the pipeline: forward, backward (fused embedding update), dense step.

        With trainer.on_nonfinite=skip, a batch whose loss is not finite on any rank is dropped by
        every rank before its backward pass (nothing is updated); returns None then.
        """
        self.optimizer.zero_grad()
        loss, _ = self._forward(batch.to(self.device))
        if self.cfg.trainer.on_nonfinite == "skip":
            finite = torch.isfinite(loss.detach()).float().reshape(1)
            dist.all_reduce(finite, op=dist.ReduceOp.MIN, group=self.pg)
            if finite.item() == 0.0:
                self.skipped_steps.append(self.step + 1)
                return None
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def train(self) -> dict:
        """Train for `total_steps`, evaluating every trainer.eval_every_steps and at the end."""
        cfg, world = self.cfg, self.world
        if cfg.trainer.eval_only:
            return self._finish(0, 0.0, 0.0, self.evaluate())
        total = self.total_steps
        log = MetricsLog(self.run_dir / "metrics.jsonl" if self.run_dir else None)
        progress = Progress(total, cfg.trainer.progress, world.is_main)
        if world.is_main:
            progress.message(f"sharding plan ({world.world_size} ranks, {backend_for(cfg.topology)}):\n{self.plan}")
        batches = self._batches("train", self.step, total - self.step)
        window: List[torch.Tensor] = []
        train_seconds, window_start = 0.0, time.perf_counter()
        started, first_step = time.perf_counter(), self.step
        evaluation: dict = {}
        self.model.train()
        while self.step < total:
            lr = self.schedule.apply(self.step) * cfg.optim.dense.lr
            if self.pipeline is not None:
                loss = self.pipeline.progress(batches)[0]
            else:
                loss = self.train_step(next(batches))
            if loss is not None:
                window.append(loss)
            self.step += 1
            last = self.step == total
            if window and (self.step % cfg.trainer.log_every_steps == 0 or last):
                mean_loss = self._global_mean(window)
                if not math.isfinite(mean_loss):
                    latest = latest_checkpoint(self.checkpointer.root) if self.checkpointer else None
                    raise NonFiniteLossError(
                        f"loss is {mean_loss} in steps {self.step - len(window) + 1}..{self.step}; "
                        f"last good checkpoint: {latest or 'none'}; lower the learning rates and resume "
                        "from it (trainer.resume=auto), or set trainer.log_every_steps=1 to stop sooner"
                    )
                seconds = time.perf_counter() - window_start
                train_seconds += seconds
                samples_per_s = len(window) * cfg.data.global_batch_size / seconds
                self.losses.append(mean_loss)
                log.write(step=self.step, loss=mean_loss, lr=lr, samples_per_s=samples_per_s)
                progress.update(self.step, len(window), loss=mean_loss, lr=lr, samples_per_s=samples_per_s)
                window = []
                window_start = time.perf_counter()
            every = cfg.trainer.eval_every_steps
            if (every and self.step % every == 0) or last:
                evaluation = self.evaluate()
                log.write(step=self.step, **{f"eval_{k}": v for k, v in evaluation.items()})
                progress.message(
                    f"eval at step {self.step}: auc {evaluation.get('auc', float('nan')):.4f} "
                    f"logloss {evaluation.get('logloss', float('nan')):.4f}"
                )
                window_start = time.perf_counter()
            every = cfg.checkpoint.every_steps
            if self.checkpointer is not None and ((every and self.step % every == 0) or (last and cfg.checkpoint.at_end)):
                path = self.save_checkpoint()
                progress.message(f"checkpoint: {path}")
                window_start = time.perf_counter()
        if first_step >= total:  # resumed at the end: nothing to train, still report the model
            evaluation = self.evaluate()
        progress.close()
        log.close()
        return self._finish(self.step - first_step, train_seconds, time.perf_counter() - started, evaluation)

    def _finish(self, steps: int, train_seconds: float, wall_seconds: float, evaluation: dict) -> dict:
        summary = self._summary(steps, train_seconds, wall_seconds, evaluation)
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / "summary.json", summary)
        return summary

    def detached_model(self) -> torch.nn.Module:
        """The model with its plain forward (the pipeline's rewrite undone), for direct calls."""
        return self.pipeline.detach() if self.pipeline is not None else self.model

    @torch.no_grad()
    def evaluate(self) -> dict:
        """AUC and log loss over the eval split, gathered from all ranks ({} if there is none)."""
        n = self.cfg.data.eval_batches  # 0: no evaluation
        available = self.source.num_batches("eval")
        if available is not None:
            n = min(n, available)
        if not n:
            return {}
        model = self.detached_model()
        model.eval()
        logits, labels = [], []
        for batch in self._batches("eval", 0, n):
            _, (_, batch_logits, batch_labels) = self._forward(batch.to(self.device))
            logits.append(batch_logits)
            labels.append(batch_labels)
        model.train()
        all_logits = self._gather(torch.cat(logits).float())
        all_labels = self._gather(torch.cat(labels).float())
        auc, logloss = auc_and_logloss(all_logits, all_labels)
        return {"auc": auc, "logloss": logloss, "samples": int(all_labels.numel())}

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate equal-sized tensors [N] from every rank, in rank order -> [W * N]."""
        parts = [torch.empty_like(t) for _ in range(self.world.world_size)]
        dist.all_gather(parts, t, group=self.pg)
        return torch.cat(parts).cpu()

    def _global_mean(self, losses: List[torch.Tensor]) -> float:
        """Mean over steps and ranks of per-rank losses (each rank's loss is over its slice)."""
        total = torch.stack(losses).sum()
        dist.all_reduce(total, group=self.pg)
        return total.item() / (len(losses) * self.world.world_size)

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
            "peak_rss_mb_per_rank": peaks,
        }
