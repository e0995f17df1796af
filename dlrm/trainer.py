"""The trainer: build (topology -> model -> sharding -> optimizers), train, evaluate, summarise."""

from __future__ import annotations

from dlrm.errors import UserError
import hashlib
import itertools
import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from collections import Counter
from typing import Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from dlrm.checkpoint import Checkpointer, CheckpointError, latest_checkpoint, model_signature, step_tensor
from dlrm.comm_hooks import use_hierarchical_allreduce
from dlrm.config import Config
from dlrm.data.loader import make_source
from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.logs import JOB_START
from dlrm.metrics import MetricsLog, Progress, auc_and_logloss, peak_rss_mb, write_json_atomic
from dlrm.model import build_model, initialize
from dlrm.optim import LRSchedule, build_optimizer, fuse_embedding_optimizer
from dlrm.phases import PHASES, STEP_RANGE, fitted_topology, kineto_quiet, spans_of, step_breakdown
from dlrm.sharding import describe_plan, plan_sharding, shard_model
from dlrm.topology import (
    World,
    backend_for,
    build_process_groups,
    device_for,
    init_distributed,
    planner_topology,
)

log = logging.getLogger(__name__)
COMM_KINDS = ("alltoall", "reduce_scatter", "allgather", "allreduce")


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
    """

    def __init__(self, cfg: Config, world: World, run_dir: Optional[Path] = None) -> None:
        self.cfg = cfg
        self.world = world
        self.comms_bench = None  # a comms bench result to fit the cost model to (trainer.comms_bench)
        if cfg.trainer.comms_bench:
            from dlrm.comms.report import load_bench

            self.comms_bench = load_bench(cfg.trainer.comms_bench)
            fitted_topology(cfg.topology, self.comms_bench, "alltoall", world.local_world_size)  # fails early
        self.run_dir = run_dir if world.is_main else None
        self.device = device_for(cfg.topology, world, tf32=cfg.trainer.tf32)
        self.source = make_source(cfg)  # data errors before any process group or table exists
        self.pg = init_distributed(cfg.topology, world)
        self.groups = build_process_groups(self.device, world.world_size // world.local_world_size, world.local_world_size)

        model = build_model(cfg.model)
        self.dense_params = sum(p.numel() for n, p in model.named_parameters() if "embedding_bags" not in n)
        fuse_embedding_optimizer(model, cfg.optim.embedding)
        topology = planner_topology(cfg.topology, world.world_size, world.local_world_size)
        self.plan = plan_sharding(cfg, model, topology, self.pg)
        self.model = shard_model(model, self.plan, self.pg, self.device)
        if cfg.trainer.dense_allreduce == "hierarchical" and not use_hierarchical_allreduce(self.model, self.groups):
            raise RuntimeError("trainer.dense_allreduce=hierarchical, but the model has no DDP module to hook")
        initialize(self.model, cfg.model, cfg.seed)
        self.optimizer = build_optimizer(self.model, self.model.fused_optimizer, cfg.optim)
        self.schedule = LRSchedule(self.optimizer, cfg.optim.schedule)
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
        log.info(f"resumed from {path} at step {self.step}")

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

    def _one_step(self, batches: Iterator) -> Optional[torch.Tensor]:
        """One training step, labelled STEP_RANGE for the profiler; the loss (None: skipped)."""
        with record_function(STEP_RANGE):
            if self.pipeline is not None:
                loss = self.pipeline.progress(batches)[0]
            else:
                with record_function("## next_batch ##"):
                    batch = next(batches)
                loss = self.train_step(batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the step's GPU work ends inside its range
        return loss

    def _profiled_step(self, batches: Iterator, acc: torch.Tensor) -> Optional[torch.Tensor]:
        """One step under torch.profiler; adds [1, its wall seconds, the profiler's extra seconds,
        seconds per phase..., per collective kind...] to acc."""
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        begin = time.perf_counter()
        prof = profile(activities=activities)
        with kineto_quiet():
            prof.start()
        try:
            start = time.perf_counter()
            loss = self._one_step(batches)
            wall = time.perf_counter() - start
        finally:
            with kineto_quiet():
                prof.stop()
        (phases, comm), = step_breakdown(spans_of(prof))
        overhead = time.perf_counter() - begin - wall
        figures = [1.0, wall, overhead] + [phases[k] for k in PHASES] + [comm.get(k, 0.0) for k in COMM_KINDS]
        acc += torch.tensor(figures, dtype=acc.dtype)
        return loss

    def _config_lines(self) -> List[str]:
        """The run's configuration in a few console lines."""
        cfg, world = self.cfg, self.world
        m, tables = cfg.model, cfg.model.tables
        rows = sum(t.rows for t in tables)
        dims = sorted({t.dim for t in tables})
        emb = sum(t.rows * t.dim for t in tables)
        o = cfg.optim
        batch = cfg.data.global_batch_size
        return [
            f"model: {len(tables)} tables, {rows:,} rows, dim {'/'.join(map(str, dims))} ({emb / 1e6:,.1f}M embedding "
            f"params); bottom {'-'.join(map(str, [m.dense_in_features] + list(m.bottom_mlp)))}, top "
            f"{'-'.join(map(str, m.top_mlp))}, interaction {m.interaction} ({self.dense_params / 1e6:,.2f}M dense params)",
            f"data: {cfg.data.source}, global batch {batch:,} ({batch // world.world_size:,} per rank), "
            f"{self.total_steps} steps, eval {cfg.data.eval_batches} batches",
            f"optim: embedding {o.embedding.name} lr {o.embedding.lr:g} (fused into backward), "
            f"dense {o.dense.name} lr {o.dense.lr:g}",
            f"topology: {cfg.topology.name}, {world.world_size // world.local_world_size} node(s) x "
            f"{world.local_world_size} rank(s), {backend_for(cfg.topology)} on {self.device.type}",
        ]

    def _plan_lines(self) -> List[str]:
        """The sharding plan: one line per (sharding type, kernel), with the tables per rank."""
        groups: Dict[tuple, List[dict]] = {}
        for row in describe_plan(self.plan):
            groups.setdefault((row["sharding_type"], row["compute_kernel"]), []).append(row)
        lines = [f"sharding plan ({self.world.world_size} ranks, {backend_for(self.cfg.topology)}):"]
        for (kind, kernel), rows in groups.items():
            per_rank = Counter(rank for row in rows for rank in row["ranks"])
            spread = ", ".join(f"{r}:{n}" for r, n in sorted(per_rank.items()))
            lines.append(f"  {kind:<17} {len(rows):>3} tables, kernel {kernel}; tables on rank {spread}")
        return lines

    def train(self) -> dict:
        """Train for `total_steps`, evaluating every trainer.eval_every_steps and at the end."""
        cfg, world, tr = self.cfg, self.world, self.cfg.trainer
        if world.is_main:
            for line in self._config_lines() + self._plan_lines():
                log.info(line)
        if tr.eval_only:
            return self._finish(0, 0.0, 0.0, self.evaluate(), None)
        total = self.total_steps
        log_ = MetricsLog(
            self.run_dir / "metrics.jsonl" if self.run_dir else None,
            self.run_dir / "tensorboard" if self.run_dir and tr.tensorboard else None,
        )
        progress = Progress(total, tr.progress, world.is_main, first_step=self.step)
        batches = self._batches("train", self.step, total - self.step)
        window: List[torch.Tensor] = []
        width = 3 + len(PHASES) + len(COMM_KINDS)
        sampled = torch.zeros(width, dtype=torch.float64)  # this window's profiled steps, summed
        run_breakdown = torch.zeros(width, dtype=torch.float64)  # windows after the first, summed
        train_seconds, window_start = 0.0, time.perf_counter()
        started, first_step = time.perf_counter(), self.step
        trace = self._trace_profiler()
        tracing = False
        evaluation: dict = {}
        self.model.train()
        while self.step < total:
            lr = self.schedule.apply(self.step) * cfg.optim.dense.lr
            if trace is not None and not tracing and tr.profile[0] <= self.step + 1 <= tr.profile[1]:
                with kineto_quiet():
                    trace.start()
                tracing = True
            window_ends = (self.step + 1) % tr.log_every_steps == 0 or self.step + 1 == total
            in_trace = tr.profile is not None and tr.profile[0] <= self.step + 1 <= tr.profile[1]
            if tr.breakdown and window_ends and not in_trace:
                loss = self._profiled_step(batches, sampled)
            else:
                loss = self._one_step(batches)
            if tracing and (self.step + 1 == tr.profile[1] or self.step + 1 == total):
                with kineto_quiet():
                    trace.stop()
                trace, tracing = None, False
                log.info(f"profiler trace of steps {tr.profile[0]}-{tr.profile[1]}: {self.run_dir / 'profile'}")
            if loss is not None:
                window.append(loss)
            self.step += 1
            last = self.step == total
            if window and (self.step % tr.log_every_steps == 0 or last):
                mean_loss = self._global_mean(window)
                if not math.isfinite(mean_loss):
                    latest = latest_checkpoint(self.checkpointer.root) if self.checkpointer else None
                    raise NonFiniteLossError(
                        f"loss is {mean_loss} in steps {self.step - len(window) + 1}..{self.step}; "
                        f"last good checkpoint: {latest or 'none'}. Either the training diverged (lower "
                        "optim.embedding.lr / optim.dense.lr and resume from it with trainer.resume=auto) or "
                        "the input holds NaN/inf values (check the data files; a Criteo loader refuses them "
                        "when it verifies them); trainer.log_every_steps=1 stops sooner"
                    )
                seconds = time.perf_counter() - window_start
                train_seconds += seconds
                samples_per_s = len(window) * cfg.data.global_batch_size / seconds
                self.losses.append(mean_loss)
                record = dict(step=self.step, loss=mean_loss, lr=lr, samples_per_s=samples_per_s,
                              step_s=seconds / len(window), peak_rss_mb=peak_rss_mb())
                if self.device.type == "cuda":
                    record["peak_gpu_mem_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
                if tr.breakdown:
                    dist.all_reduce(sampled, group=self.pg)  # sums over ranks: mean per step below
                    if sampled[0] > 0:
                        record.update(self._breakdown_record(sampled))
                        if self.step - first_step > tr.log_every_steps or (last and not run_breakdown[0]):
                            run_breakdown += sampled  # the first window (warm-up) only if it is all
                    sampled.zero_()
                log_.write(**record)
                progress.update(self.step, len(window), loss=mean_loss, lr=lr, samples_per_s=samples_per_s)
                window = []
                window_start = time.perf_counter()
            every = tr.eval_every_steps
            if (every and self.step % every == 0) or last:
                evaluation = self.evaluate()
                log_.write("eval", step=self.step, **{f"eval_{k}": v for k, v in evaluation.items()})
                progress.message(f"eval at step {self.step}: {self._eval_text(evaluation)}")
                window_start = time.perf_counter()
            every = cfg.checkpoint.every_steps
            if self.checkpointer is not None and ((every and self.step % every == 0) or (last and cfg.checkpoint.at_end)):
                path = self.save_checkpoint()
                progress.message(f"checkpoint: {path}")
                window_start = time.perf_counter()
        if first_step >= total:  # resumed at the end: nothing to train, still report the model
            evaluation = self.evaluate()
        progress.close()
        breakdown = self._breakdown_record(run_breakdown) if run_breakdown[0] > 0 else None
        if breakdown is not None:
            log_.write("run", step=self.step, **{f"run_{k}": v for k, v in breakdown.items()})
        log_.close()
        return self._finish(self.step - first_step, train_seconds, time.perf_counter() - started, evaluation, breakdown)

    @staticmethod
    def _eval_text(evaluation: dict) -> str:
        if not evaluation:
            return "no eval data"
        auc = evaluation.get("auc")
        return f"auc {'n/a (one class)' if auc is None else f'{auc:.4f}'} logloss {evaluation['logloss']:.4f}"

    def _breakdown_record(self, summed: torch.Tensor) -> dict:
        """Mean seconds per profiled step: its wall time (the loop's clock), per phase (the profiler's
        events; they add up to the profiler's step time) and per collective kind, from the sums
        [count, wall, overhead, phases..., kinds...] over ranks and steps. profile_overhead_s: what
        profiling added to the step (start, stop, reading the events)."""
        mean = (summed[1:] / summed[0]).tolist()
        phases = dict(zip(PHASES, mean[2 : 2 + len(PHASES)]))
        return {
            "phase_s": phases,
            "profiled_step_s": mean[0],
            "profile_overhead_s": mean[1],
            "comm_s": dict(zip(COMM_KINDS, mean[2 + len(PHASES):])),
            "profiled_steps": int(summed[0].item()) // self.world.world_size,
        }

    def _trace_profiler(self) -> Optional[profile]:
        """A torch.profiler for trainer.profile's steps, on rank 0, writing to <run dir>/profile."""
        if self.cfg.trainer.profile is None or not self.world.is_main or self.run_dir is None:
            return None
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        return profile(
            activities=activities,
            record_shapes=True,
            on_trace_ready=tensorboard_trace_handler(str(self.run_dir / "profile"), worker_name="rank0"),
        )

    def _finish(
        self, steps: int, train_seconds: float, wall_seconds: float, evaluation: dict, breakdown: Optional[dict]
    ) -> dict:
        summary = self._summary(steps, train_seconds, wall_seconds, evaluation)
        if breakdown is not None:
            summary["step_breakdown"] = breakdown
            summary["comm_vs_model"] = self._comm_vs_model(breakdown["comm_s"])
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / "summary.json", summary)
        if self.world.is_main:
            for line in self._end_lines(summary):
                log.info(line)
        return summary

    def _comm_vs_model(self, measured: Dict[str, float]) -> dict:
        """Measured seconds per step of the embedding exchange (alltoall, and reduce-scatter/allgather
        of row-wise shards) and of the dense allreduce, beside `dlrm.plan`'s cost model for the same
        plan, batch and topology; ratio = measured / modelled (None where the model predicts 0).

        With trainer.comms_bench, the model's intra-node link takes the alpha and B fitted to the
        bench's alltoall (for the exchange) and allreduce (for the allreduce) times.
        """
        from dataclasses import replace

        from dlrm.plan import comm_summary, plan_tables

        world = self.world
        tables = plan_tables(self.plan, self.cfg, world.world_size)

        def model(collective: str) -> Dict[str, float]:
            cfg = self.cfg
            if self.comms_bench is not None:
                topology = fitted_topology(cfg.topology, self.comms_bench, collective, world.local_world_size)
                cfg = replace(cfg, topology=topology)
            return comm_summary(cfg, tables, world.world_size, world.local_world_size, self.dense_params)["time_s"]

        out = {}
        for name, seconds, modelled in (
            ("embedding_exchange", measured["alltoall"] + measured["reduce_scatter"] + measured["allgather"],
             model("alltoall")["alltoall_s"]),
            ("dense_allreduce", measured["allreduce"], model("allreduce")["allreduce_s"]),
        ):
            out[name] = {"measured_s": seconds, "model_s": modelled, "ratio": seconds / modelled if modelled else None}
        out["model"] = "fitted to " + self.cfg.trainer.comms_bench if self.comms_bench is not None else "topology config"
        return out

    def _end_lines(self, summary: dict) -> List[str]:
        """The console's closing lines: throughput, the per-phase breakdown, comms against the model, outputs."""
        lines = []
        speed = summary["train_samples_per_s"]
        if speed:
            lines.append(
                f"trained {summary['steps']} steps: {speed:,.0f} samples/s, "
                f"{self.cfg.data.global_batch_size / speed * 1e3:.1f} ms/step; loop {summary['wall_time_s']:.1f} s, "
                f"job {summary['job_wall_time_s']:.1f} s"
            )
        b = summary.get("step_breakdown")
        if b is not None:
            ms = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in b["phase_s"].items())
            lines.append(
                f"step breakdown, ms (mean of {b['profiled_steps']} profiled steps, {b['profiled_step_s'] * 1e3:.1f} ms "
                f"each; profiling added {b['profile_overhead_s'] * 1e3:.0f} ms per profiled step): {ms}"
            )
            cm = summary["comm_vs_model"]
            if self.world.world_size > 1:
                lines.append(
                    "comms per step, measured vs model: " + "; ".join(
                        f"{k} {v['measured_s'] * 1e3:.2f} vs {v['model_s'] * 1e3:.2f} ms"
                        + (f" (x{v['ratio']:.2f})" if v["ratio"] is not None else "")
                        for k, v in cm.items() if k != "model"
                    )
                )
        if self.run_dir is not None:
            lines.append(f"outputs: {self.run_dir} (summary.json, metrics.jsonl, train.log"
                         + (", tensorboard/" if self.cfg.trainer.tensorboard else "") + ")")
        return lines

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
            "job_wall_time_s": time.monotonic() - JOB_START,
            "peak_rss_mb_per_rank": peaks,
        }
