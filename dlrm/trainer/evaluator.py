"""Evaluation: AUC, log loss, NE and calibration per task over the eval split at its cadence, and the
stop at a target AUC."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

from dlrm.common.cadence import Every
from dlrm.config import TrainerConfig
from dlrm.trainer.metrics import score_on_rank0


def eval_batch_count(eval_batches: int, available: int | None) -> int:
    """The batches an evaluation scores: `eval_batches` (data.eval_batches), or fewer if the eval split
    holds fewer (`available`; None: unbounded; 0: no eval split)."""
    return eval_batches if available is None else min(eval_batches, available)


class Evaluator:
    """Scores a model on eval batches when due (trainer.eval_every_steps, and the last step), and
    tells when an evaluation first reaches trainer.target_auc.

    Args:
        tr: the trainer section (eval_every_steps, target_auc, select_metric, patience, dense_precision).
        tasks: the model's task names, in its order.
        global_batch_size: the samples of a step (data.global_batch_size), for samples_to_target.
        device, pg: where the scores are computed, and the training process group.
    """

    def __init__(
        self, tr: TrainerConfig, tasks: list[str], global_batch_size: int, device: torch.device, pg: dist.ProcessGroup
    ) -> None:
        self.tr, self.tasks, self.global_batch_size, self.device, self.pg = tr, tasks, global_batch_size, device, pg
        self.every = Every(tr.eval_every_steps)
        self.target_step: int | None = None  # the step whose evaluation first reached trainer.target_auc
        self.best: tuple[int, float] | None = None  # (step, value) of the best trainer.select_metric so far
        self.stale = 0  # evaluations since the best
        self.stopped_early = False

    def due(self, step: int, last: bool) -> bool:
        """Whether an evaluation is due after `step` (`last`: the run's last step)."""
        return self.every.due(step, last)

    @torch.no_grad()
    def evaluate_periods(self, model: torch.nn.Module, periods: Mapping[str, Iterable]) -> dict:
        """`evaluate` over the batches of every evaluated period together, with {"periods": {period:
        its own figures}} added: a dataset partitioned by time scores each period apart (the same
        periods, each at least one batch, on every rank)."""
        scored = {p: self._scores(model, batches) for p, batches in periods.items()}
        figures = score_on_rank0(torch.cat(list(scored.values()), dim=2), self.pg, self.tasks)
        figures["periods"] = {p: score_on_rank0(local, self.pg, self.tasks) for p, local in scored.items()}
        return figures

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, batches: Iterable) -> dict:
        """Score `model` on `batches`, under bf16 autocast as in training; a collective.

        Args:
            model: `model(batch)` -> (loss, (loss, logits, labels)), logits and labels [B] for one task,
                [B, T] for T tasks; back in train mode after.
            batches: this rank's slice of the eval split, at least one batch on every rank.

        Returns:
            The figures of `score_on_rank0`, computed on rank 0 and the same on every rank.
        """
        return score_on_rank0(self._scores(model, batches), self.pg, self.tasks)

    def _scores(self, model: torch.nn.Module, batches: Iterable) -> torch.Tensor:
        """This rank's logits and labels over `batches`: [2, T, N]; [3, T, N] with the rows' sample
        weights (batches that carry them: data.parquet.weight)."""
        bf16 = self.tr.dense_precision == "bf16"
        model.eval()
        logits, labels, weights = [], [], []
        for batch in batches:
            batch = batch.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
                _, (_, batch_logits, batch_labels) = model(batch)
            logits.append(batch_logits.reshape(batch_logits.shape[0], -1))  # [B, T]
            labels.append(batch_labels.reshape(batch_labels.shape[0], -1))
            if getattr(batch, "weights", None) is not None:
                weights.append(batch.weights.reshape(-1, 1).expand_as(logits[-1]))
        model.train()
        rows = [torch.cat(logits).float(), torch.cat(labels).float()]
        if weights:
            rows.append(torch.cat(weights).float())
        return torch.stack(rows).transpose(1, 2)  # [2 or 3, T, N]

    def reached_target(self, evaluation: dict, step: int) -> bool:
        """Whether `evaluation` (at `step`) is the first to reach trainer.target_auc (its "auc": the
        first task's); every rank holds rank 0's figures (see `evaluate`), so all stop at the same
        step. Records the step."""
        target = self.tr.target_auc
        auc = evaluation.get("auc")
        if target is None or self.target_step is not None or auc is None or auc < target:
            return False
        self.target_step = step
        return True

    def stalled(self, evaluation: dict, step: int) -> bool:
        """Note `evaluation` (at `step`) for trainer.select_metric; True when trainer.patience
        evaluations in a row have not improved on the best (every rank holds the same figures)."""
        tr, metric = self.tr, self.tr.select_metric
        value = evaluation.get(metric) if metric else None
        if metric is None or value is None:
            return False
        higher = metric.split("/", 1)[0] == "auc"
        if self.best is None or (value > self.best[1] if higher else value < self.best[1]):
            self.best, self.stale = (step, float(value)), 0
            return False
        self.stale += 1
        self.stopped_early = bool(tr.patience) and self.stale >= tr.patience
        return self.stopped_early

    def steps_to_next(self, step: int, total_steps: int) -> int:
        """The steps from `step` to the next evaluation's (or to `total_steps`, if that comes first)."""
        n = self.every.n
        return (min(total_steps, (step // n + 1) * n) if n > 0 else total_steps) - step

    def stop_reason(self, evaluation: dict, step: int) -> str | None:
        """Why the run ends at this evaluation (at `step`), or None: trainer.patience evaluations without
        a better trainer.select_metric (`stalled`), or trainer.target_auc first reached (`reached_target`)."""
        if self.stalled(evaluation, step):
            best_step, best = self.best or (0, math.nan)
            return (
                f"{self.tr.select_metric} has not improved on {best:.5f} (step {best_step}) in "
                f"{self.tr.patience} evaluation(s): stopping at step {step}"
            )
        if not self.reached_target(evaluation, step):
            return None
        samples = step * self.global_batch_size
        return (
            f"target AUC {self.tr.target_auc} reached at step {step} ({samples:,} samples): "
            f"auc {evaluation['auc']:.5f}; stopping"
        )

    def summary_fields(self, summary: dict) -> dict:
        """The summary's selection entries (with trainer.select_metric) and target entries (with
        trainer.target_auc); {} with neither."""
        selection = {}
        if self.tr.select_metric is not None:
            selection = {
                "select_metric": self.tr.select_metric,
                "best_step": self.best[0] if self.best else None,
                "best_value": self.best[1] if self.best else None,
                "stopped_early": self.stopped_early,
            }
        target = self.tr.target_auc
        if target is None:
            return selection
        step = self.target_step
        return {
            **selection,
            "target_auc": target,
            "reached_target": step is not None,
            "steps_to_target": step,
            "samples_to_target": step * self.global_batch_size if step is not None else None,
        }
