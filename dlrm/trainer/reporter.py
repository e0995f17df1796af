"""The run's outputs: the console, metrics.jsonl and TensorBoard at each log window and evaluation,
and summary.json at the end (rank 0 writes; the figures come from every rank)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from dlrm.common.cadence import Every
from dlrm.common.errors import UserError
from dlrm.common.io import disk_full_is_user_error, write_json_atomic
from dlrm.config import Config
from dlrm.distributed.topology import backend_for
from dlrm.distributed.world import World
from dlrm.run.logs import JOB_START
from dlrm.trainer import console
from dlrm.trainer.clock import RunTime, ThroughputWindow
from dlrm.trainer.metrics import peak_rss_mb
from dlrm.trainer.metrics_log import MetricsLog
from dlrm.trainer.progress import Progress

log = logging.getLogger(__name__)


def global_mean_and_signal(
    losses: list[torch.Tensor], signum: int | None, pg: dist.ProcessGroup, world_size: int
) -> tuple[float, int | None]:
    """Mean over steps and ranks of per-rank losses, and the stop signal any rank got, in one all-reduce.

    Args:
        losses: this rank's per-step losses (0-d tensors, each over its slice of the batch).
        signum: the stop signal this rank got, or None.
        pg: the process group of all ranks.
        world_size: the ranks in `pg`.

    Returns:
        (mean loss, the signal reported: SIGTERM before SIGHUP before SIGINT, or None).
    """
    total = torch.stack(losses).sum().float()
    flags = [float(signum == s) for s in _STOP_ORDER]
    figures = torch.cat([total.reshape(1), total.new_tensor(flags)])
    dist.all_reduce(figures, group=pg)
    loss, *got = figures.tolist()
    return loss / (len(losses) * world_size), next((s for s, n in zip(_STOP_ORDER, got, strict=True) if n), None)


_STOP_ORDER = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # the stop signals, the one reported first


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN or infinite loss; the message names the steps and the last checkpoint."""

    same_on_all_ranks = True  # the loss is the global mean

    @classmethod
    def of_window(cls, loss: float, first: int, last: int, checkpoint: Path | None) -> NonFiniteLossError:
        """The error of a log window of steps `first`..`last` whose mean loss is `loss`; `checkpoint`:
        the last one saved (None: none)."""
        return cls(
            f"loss is {loss} in steps {first}..{last}; last good checkpoint: {checkpoint or 'none'}. Either "
            "the training diverged (lower optim.embedding.lr / optim.dense.lr and resume from it with "
            "trainer.resume=auto) or the input holds NaN/inf values (check the data files; a Criteo loader "
            "refuses them when it verifies them); trainer.log_every_steps=1 stops sooner"
        )


def gathered(value: float, device: torch.device, pg: dist.ProcessGroup, world_size: int) -> list[float]:
    """`value` of every rank, in rank order (one all-gather on the training device)."""
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    parts = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(parts, mine, group=pg)
    return torch.cat(parts).cpu().tolist()


def samples_per_s(steps: int, batch: int, seconds: float) -> float | None:
    """Training throughput of `steps` steps of `batch` samples in `seconds` (None if nothing was timed)."""
    return steps * batch / seconds if steps and seconds else None


class SummaryPart(Protocol):
    """A component that adds entries to the run's summary."""

    def summary_fields(self, summary: dict) -> dict:
        """The entries to add, given the summary so far."""
        ...


class Reporter:
    """What one `Trainer.train` call reports: `open` starts the records (a `start` event first: a
    continuation repeats the steps after its checkpoint), `window` and `evaluation` add to them,
    `close` ends them, `summary` writes summary.json and the closing lines.

    Args:
        cfg: the whole config: `announce` describes the job's sections (`console.config_lines`).
        world, device, pg: this rank, the training device and process group.
        run_dir: where rank 0 writes (None off rank 0, or for no files).
        sync: waits for the device's queued work (the throughput clock's, when it stops).
    """

    def __init__(
        self,
        cfg: Config,
        world: World,
        device: torch.device,
        pg: dist.ProcessGroup,
        run_dir: Path | None,
        sync: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.world, self.device, self.pg, self.run_dir = cfg, world, device, pg, run_dir
        self.sync = sync
        self.losses: list[float] = []  # the global mean loss of every logged window; summary's final_loss
        self.log = MetricsLog(None)
        self.progress = Progress(0, "none", False)
        self.every = Every(cfg.trainer.log_every_steps)
        self.window: ThroughputWindow = ThroughputWindow()
        self.run_time = RunTime(self.window)  # the whole run's time: a checkpoint records it, a resume carries it
        self.first_step = 0
        self.started = time.perf_counter()

    def due(self, step: int, last: bool) -> bool:
        """Whether the log window closes after `step` (trainer.log_every_steps, or `last`) and holds steps."""
        return self.every.due(step, last) and bool(self.window.losses)

    def add(self, loss) -> None:
        """Count one trained step (its loss, a device tensor or None) in the log window."""
        self.window.add(loss)

    def paused(self):
        """A context in which the throughput clock stops (an evaluation, a save)."""
        return self.window.paused()

    def announce(self, plan: list[dict], dense_params: int, total_steps: int, eval_batches: int) -> None:
        """Log the run's configuration and sharding plan (`describe_plan` rows) on rank 0."""
        if not self.world.is_main:
            return
        world, backend = self.world, backend_for(self.cfg.topology)
        nodes = world.world_size // world.local_world_size
        lines = console.config_lines(
            self.cfg, nodes, world.local_world_size, backend, self.device.type, dense_params, total_steps, eval_batches
        )
        for line in lines + console.plan_lines(plan, world.world_size, backend):
            log.info(line)

    def open(self, step: int, total_steps: int) -> None:
        """Start the records of an invocation at `step` of `total_steps`."""
        tr = self.cfg.trainer
        run_dir = self.run_dir
        self.log = MetricsLog(
            run_dir / "metrics.jsonl" if run_dir else None,
            run_dir / "tensorboard" if run_dir and tr.tensorboard else None,
        )
        self.log.write("run", step=step, event="start", resumed=step > 0)
        self.progress = Progress(total_steps, tr.progress, self.world.is_main, first_step=step)
        self.window = ThroughputWindow(sync=self.sync)
        self.run_time.open(step, self.window)
        self.first_step, self.started = step, time.perf_counter()

    def window_record(
        self, step: int, mean_loss: float, steps: int, seconds: float, lr: float, phases: dict, vocabulary: dict
    ) -> None:
        """A closed log window of `steps` steps in `seconds` ending at `step`: to metrics.jsonl,
        TensorBoard and the progress display; `phases` the profiler's window record, `vocabulary` the
        tables' vocabulary figures (vocab_<table>_*)."""
        self.losses.append(mean_loss)
        samples_per_s = steps * self.cfg.data.global_batch_size / seconds
        record: dict[str, Any] = dict(
            step=step,
            loss=mean_loss,
            lr=lr,
            samples_per_s=samples_per_s,
            step_s=seconds / steps,
            peak_rss_mb=peak_rss_mb(),
        )
        if self.device.type == "cuda":
            record["peak_gpu_mem_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        record.update(phases)
        record.update(vocabulary)
        self.log.write(**record)
        self.progress.update(step, steps, loss=mean_loss, lr=lr, samples_per_s=samples_per_s)

    def evaluation(self, step: int, evaluation: dict) -> None:
        """An evaluation's figures: to metrics.jsonl (per evaluated period under eval_periods, as
        "<period>/<figure>"), TensorBoard (eval_periods/<period>/<figure>) and the console."""
        figures = {f"eval_{k}": v for k, v in evaluation.items() if k != "periods"}
        periods = evaluation.get("periods", {})
        if periods:
            figures["eval_periods"] = {f"{p}/{k}": v for p, f in periods.items() for k, v in f.items()}
        self.log.write("eval", step=step, **figures)
        self.progress.message(f"eval at step {step}: {console.eval_text(evaluation)}")
        for p, f in periods.items():
            self.progress.message(f"  period {p}: {console.eval_text(f)} ({f.get('samples')} samples)")

    def message(self, text: str) -> None:
        """Log `text` for the console and train.log (rank 0)."""
        self.progress.message(text)

    def close(self, step: int, breakdown: dict | None) -> None:
        """End the records (the run's step breakdown last, if profiled)."""
        self.progress.close()
        if breakdown is not None:
            self.log.write("run", step=step, **{f"run_{k}": v for k, v in breakdown.items()})
        self.log.close()

    def summary(
        self, step: int, evaluation: dict, skipped_steps: list[int], fields: dict, parts: Sequence[SummaryPart] = ()
    ) -> dict:
        """The run's summary.json (written on rank 0) and its closing console lines; a collective
        (the ranks' peak memory). Throughput and wall time cover the whole run, every invocation
        (`this_invocation`: this one's). `fields`: the trainer's own further entries; then each of
        `parts` adds its `summary_fields`, in order."""
        batch = self.cfg.data.global_batch_size
        steps, seconds = step - self.first_step, self.window.train_seconds
        run = self.run_time.record(step)
        summary = {
            "world_size": self.world.world_size,
            "backend": backend_for(self.cfg.topology),
            "device": str(self.device.type),
            "topology": self.cfg.topology.name,
            "steps": step,
            "global_batch_size": batch,
            "train_samples_per_s": samples_per_s(run["timed_steps"], batch, run["train_seconds"]),
            "timed_steps": run["timed_steps"],
            "invocations": run["invocations"],
            "final_loss": self.losses[-1] if self.losses else None,
            "skipped_steps": skipped_steps,
            "eval_auc": evaluation.get("auc"),
            "eval_logloss": evaluation.get("logloss"),
            "eval_ne": evaluation.get("ne"),
            "eval_calibration": evaluation.get("calibration"),
            **{f"eval_{k}": v for k, v in evaluation.items() if "/" in k},  # per task, with several
            **({"eval_periods": evaluation["periods"]} if evaluation.get("periods") else {}),
            "wall_time_s": run["wall_seconds"],
            "this_invocation": {
                "first_step": self.first_step,
                "steps": steps,
                "train_samples_per_s": samples_per_s(steps, batch, seconds),
                "wall_time_s": time.perf_counter() - self.started,
            },
            "job_wall_time_s": time.monotonic() - JOB_START,
            "peak_rss_mb_per_rank": gathered(peak_rss_mb(), self.device, self.pg, self.world.world_size),
        }
        if self.device.type == "cuda":
            peak_gpu = torch.cuda.max_memory_allocated(self.device) / 2**20
            summary["peak_gpu_mem_mb_per_rank"] = gathered(peak_gpu, self.device, self.pg, self.world.world_size)
        summary.update(fields)
        for part in parts:
            summary.update(part.summary_fields(summary))
        if self.run_dir is not None:
            with disk_full_is_user_error(self.run_dir / "summary.json", "the run's summary"):
                write_json_atomic(self.run_dir / "summary.json", summary)
        if self.world.is_main:
            tensorboard = self.cfg.trainer.tensorboard
            for line in console.end_lines(summary, batch, self.world.world_size, self.run_dir, tensorboard):
                log.info(line)
        return summary
