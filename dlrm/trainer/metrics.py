"""Training metrics: AUC, log loss, normalized entropy and calibration per task, throughput, peak memory,
metrics.jsonl and TensorBoard.

The four figures are a few torch ops, run on rank 0 where the scores are (neither torchmetrics nor
torchrec.metrics is imported). AUC is `exact_auc`, the Mann-Whitney statistic in float64 (exact up to
2^53 samples). Log loss is torch's BCE-with-logits from the logits. NE and calibration follow
TorchRec's NEMetric and CalibrationMetric: NE = cross-entropy of the predicted probabilities /
entropy of the base rate (the label mean), both clamped at 1e-12 as TorchRec does; calibration = sum
of predicted probabilities / sum of labels. With sample weights (data.parquet.weight) each row counts
its weight's times in all four (`weighted_auc`: with integer weights, the AUC of the rows repeated).
"""

from __future__ import annotations

import math
import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F


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


def weighted_auc(scores: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """ROC AUC of scores [N] against 0/1 labels [N], each row counted `weights` [N] (>= 0) times: the
    weighted share of (positive, negative) pairs ordered right, ties counted half; a 0-dim float64
    tensor (NaN when either class weighs 0). With integer weights, `exact_auc` of the rows repeated.

    One sort: per tie group, its positive weight times (the negative weight below it + half its own)."""
    sorted_scores, order = torch.sort(scores.reshape(-1))
    y = labels.reshape(-1)[order].to(torch.float64)
    w = weights.reshape(-1)[order].to(torch.float64)
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=scores.device), counts)
    positive = torch.zeros(counts.numel(), dtype=torch.float64, device=scores.device).index_add_(0, group, w * y)
    negative = torch.zeros_like(positive).index_add_(0, group, w * (1 - y))
    below = torch.cumsum(negative, 0) - negative
    return (positive * (below + negative / 2)).sum() / (positive.sum() * negative.sum())


def weighted_auc_and_logloss(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[float | None, float]:
    """`auc_and_logloss` with each row counted `weights` [N] times: `weighted_auc`, and the log loss
    sum_i w_i BCE_i / sum_i w_i (float64; NaN when the weights sum to 0)."""
    auc = weighted_auc(logits.float(), labels, weights).item() if labels.numel() else math.nan
    w = weights.reshape(-1).double()
    bce = F.binary_cross_entropy_with_logits(logits.reshape(-1).double(), labels.reshape(-1).double(), reduction="none")
    logloss = ((bce * w).sum() / w.sum()).item()
    return (None if math.isnan(auc) else auc), logloss


def auc_and_logloss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float | None, float]:
    """ROC AUC (`exact_auc` of the logits) and mean binary log loss of logits [N] against 0/1
    labels [N], computed where the tensors are; the AUC is None when the labels hold one class only."""
    auc = exact_auc(logits.float(), labels).item() if labels.numel() else math.nan
    logloss = F.binary_cross_entropy_with_logits(logits.float(), labels.float()).item()
    return (None if math.isnan(auc) else auc), logloss


NE_ETA = 1e-12  # TorchRec's NEMetric clamp of probabilities and of the base rate
METRICS = ("auc", "logloss", "ne", "calibration")  # per task, in this order


def _sum(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return x.sum() if weights is None else (x * weights).sum()


def task_metrics(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None
) -> dict[str, float | None]:
    """One task's figures, computed where the tensors are.

    Args:
        logits: [N] float.
        labels: [N] 0/1.
        weights: [N] sample weights (>= 0), each row counted that many times; None: 1 each.

    Returns:
        {"auc", "logloss", "ne", "calibration"}: AUC and NE None when the labels hold one class only,
        calibration None when they hold no positive (undefined then).
    """
    w = None if weights is None else weights.reshape(-1).double()
    auc, logloss = auc_and_logloss(logits, labels) if w is None else weighted_auc_and_logloss(logits, labels, w)
    y = labels.reshape(-1).double()
    p = torch.sigmoid(logits.reshape(-1).double())
    n = y.numel() if w is None else w.sum().item()
    positives = _sum(y, w).item()
    q = p.clamp(NE_ETA, 1 - NE_ETA)
    cross_entropy = -_sum(y * q.log() + (1 - y) * (1 - q).log(), w)  # nats: the ratio is base-free
    base = min(max(positives / n, NE_ETA), 1 - NE_ETA) if n else 0.5
    entropy = -(positives * math.log(base) + (n - positives) * math.log(1 - base))
    ne = (cross_entropy / entropy).item() if 0 < positives < n else None
    calibration = (_sum(p, w) / positives).item() if positives > 0 else None
    return {"auc": auc, "logloss": logloss, "ne": ne, "calibration": calibration}


def evaluation_record(per_task: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """The evaluation's keys from each task's `task_metrics` ({task: metrics}, in model.tasks' order):
    one task: auc, logloss, ne, calibration; several: those of the first task (trainer.target_auc
    watches it), and <metric>/<task> for every task."""
    tasks = list(per_task)
    record: dict[str, float | None] = dict(per_task[tasks[0]])
    if len(tasks) > 1:
        for task, figures in per_task.items():
            record.update({f"{k}/{task}": v for k, v in figures.items()})
    return record


def score_on_rank0(local: torch.Tensor, group: dist.ProcessGroup, tasks: list[str] | None = None) -> dict:
    """The evaluation's figures over every rank's slice, computed on rank 0; a collective.

    One gather of the slices to rank 0 (on the training device), `task_metrics` there, one broadcast
    of the figures.

    Args:
        local: this rank's slice, [2, N] (row 0 logits, row 1 0/1 labels) or [2, T, N] for T tasks,
            or [3, ...] with row 2 the sample weights; N equal on all ranks.
        group: the process group of all ranks.
        tasks: the T task names (default ["label"]).

    Returns:
        The same `evaluation_record` on every rank, with "samples" added (None where undefined).
    """
    local = local if local.dim() == 3 else local.unsqueeze(1)
    n_tasks = local.shape[1]
    tasks = tasks if tasks is not None else ["label"]
    assert len(tasks) == n_tasks, (tasks, tuple(local.shape))
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    parts = [torch.empty_like(local) for _ in range(world)] if rank == 0 else None
    dist.gather(local.contiguous(), parts, group_dst=0, group=group)
    result = torch.full((n_tasks, len(METRICS)), math.nan, dtype=torch.float64, device=local.device)
    if parts is not None:
        everything = torch.cat(parts, dim=2)
        for t in range(n_tasks):
            weights = everything[2, t] if len(everything) == 3 else None
            figures = task_metrics(everything[0, t], everything[1, t], weights)
            values = [math.nan if figures[k] is None else figures[k] for k in METRICS]
            result[t] = torch.tensor(values, dtype=torch.float64)
    dist.broadcast(result, group_src=0, group=group)
    per_task = {
        task: {k: None if math.isnan(v) else v for k, v in zip(METRICS, row, strict=True)}
        for task, row in zip(tasks, result.tolist(), strict=True)
    }
    return dict(evaluation_record(per_task), samples=local.shape[2] * world)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
