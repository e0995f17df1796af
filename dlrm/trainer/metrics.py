"""Training metrics: AUC and log loss, throughput, peak memory, metrics.jsonl and summary.json."""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from dlrm.io import disk_full_is_user_error

log = logging.getLogger(__name__)
FILE_ONLY = {"console": False}  # `extra` for a record that goes to train.log but not the console


def exact_auc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ROC AUC of scores [N] against 0/1 labels [N], exact, with ties counted half; a 0-dim float64
    tensor on the inputs' device (NaN when the labels hold one class only: undefined then).

    The Mann-Whitney statistic from one sort, in torch ops (so it runs where the tensors are):
    AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N), a tie group's members all taking its
    mean rank. O(N log N); ranks are summed in float64, exact up to 2^53.
    """
    n = scores.numel()
    sorted_scores, order = torch.sort(scores.reshape(-1))
    positive = labels.reshape(-1)[order].to(torch.float64)
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)  # tie groups, ascending
    ends = torch.cumsum(counts, 0)  # 1-based rank of each group's last member
    mean_rank = (ends - counts).to(torch.float64) + (counts.to(torch.float64) + 1) / 2
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=scores.device), counts)
    positives_per_group = torch.zeros(counts.numel(), dtype=torch.float64, device=scores.device)
    positives_per_group.index_add_(0, group, positive)
    p = positive.sum()
    negatives = n - p
    rank_sum = (positives_per_group * mean_rank).sum()
    return (rank_sum - p * (p + 1) / 2) / (p * negatives)  # 0/0 = NaN with one class


def auc_and_logloss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float | None, float]:
    """ROC AUC (`exact_auc` of the logits) and mean binary log loss of logits [N] against 0/1
    labels [N], computed where the tensors are; the AUC is None when the labels hold one class only."""
    auc = exact_auc(logits.float(), labels).item() if labels.numel() else math.nan
    logloss = F.binary_cross_entropy_with_logits(logits.float(), labels.float()).item()
    return (None if math.isnan(auc) else auc), logloss


def score_on_rank0(local: torch.Tensor, group: dist.ProcessGroup) -> dict:
    """AUC and log loss of every rank's [2, N] slice (row 0 logits, row 1 0/1 labels; N equal on
    all ranks), computed on rank 0 where the tensors are (the training device): one gather of the
    slices to rank 0, `auc_and_logloss` there, one broadcast of the two figures, so every rank
    returns the same {"auc", "logloss", "samples"} (auc None when the labels hold one class)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(local) for _ in range(world)] if rank == 0 else None
    dist.gather(local, parts, group_dst=0, group=group)
    result = torch.zeros(2, dtype=torch.float64, device=local.device)
    if parts is not None:
        everything = torch.cat(parts, dim=1)
        auc, logloss = auc_and_logloss(everything[0], everything[1])
        result[0], result[1] = math.nan if auc is None else auc, logloss
    dist.broadcast(result, group_src=0, group=group)
    auc, logloss = result.tolist()
    return {"auc": None if math.isnan(auc) else auc, "logloss": logloss, "samples": local.shape[1] * world}


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class MetricsLog:
    """The run's time series, on rank 0 (other ranks pass path=None and tensorboard_dir=None).

    `metrics.jsonl`: one JSON object per `write`, with `time` (Unix seconds) and `elapsed_s` (since
    this log was opened) added. TensorBoard (`tensorboard_dir`): every number of a record as a
    scalar at its step, under `<group>/<key>` (group: "train", "eval", "phase_s", "comm_s", ...).
    """

    def __init__(self, path: Path | None, tensorboard_dir: Path | None = None) -> None:
        self._file = open(path, "a", buffering=1) if path is not None else None
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when used

            self._tb = SummaryWriter(str(tensorboard_dir))
        self._start = time.monotonic()

    def write(self, group: str = "train", **record) -> None:
        """Record `record` (it must hold `step`) under `group` (TensorBoard's tag prefix)."""
        if self._file is not None:
            stamped = dict(record, time=round(time.time(), 3), elapsed_s=round(time.monotonic() - self._start, 3))
            with disk_full_is_user_error(self._file.name, "metrics"):
                self._file.write(json.dumps(stamped, sort_keys=True) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, dict):
                    for sub, v in value.items():
                        if isinstance(v, (int, float)) and v is not None:
                            self._tb.add_scalar(f"{key}/{sub}", v, record["step"])
                elif key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    tag = key[len(group) + 1 :] if key.startswith(f"{group}_") else key
                    self._tb.add_scalar(f"{group}/{tag}", value, record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss, e.g. 75 -> '1:15'."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """A progress bar on an interactive terminal, plain log lines otherwise; silent off rank 0.

    mode: auto (bar if stderr is a terminal), bar, lines, none. Lines go to the `dlrm` logger
    (console and train.log), with elapsed time and an ETA from the mean step time so far.
    """

    def __init__(self, total: int, mode: str, enabled: bool, first_step: int = 0) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if enabled else "none"
        self.total = total
        self.first_step = first_step
        self.start = time.monotonic()
        self._bar = (
            tqdm(total=total, initial=first_step, unit="step", dynamic_ncols=True) if self.mode == "bar" else None
        )

    def update(self, step: int, steps_done: int, loss: float, lr: float, samples_per_s: float) -> None:
        """Report the figures of the window that ended at `step` after `steps_done` new steps."""
        elapsed = time.monotonic() - self.start
        eta = elapsed / max(1, step - self.first_step) * (self.total - step)
        text = f"loss {loss:.4f} lr {lr:.4g} {samples_per_s:,.0f} samples/s"
        if self._bar is not None:
            self._bar.update(steps_done)
            self._bar.set_postfix_str(text)
            log.info(f"step {step}/{self.total} {text}", extra=FILE_ONLY)  # the bar shows it on the console
        elif self.mode == "lines":
            log.info(f"step {step}/{self.total} {text} | {clock(elapsed)} elapsed, eta {clock(eta)}")
        else:
            log.debug(f"step {step}/{self.total} {text}")

    def message(self, text: str) -> None:
        """A line for the console and train.log (logged on rank 0 whatever the mode)."""
        log.info(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
