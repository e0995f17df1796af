"""Evaluation: AUC, log loss, NE and calibration per task over the eval split at its cadence, and the
stop at a target AUC."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import torch.distributed as dist

from dlrm.common.cadence import Every
from dlrm.config import Config
from dlrm.trainer.metrics import score_on_rank0


def eval_batch_count(cfg: Config, available: int | None) -> int:
    """The batches an evaluation scores: data.eval_batches, or fewer if the eval split holds fewer
    (`available`; None: unbounded; 0: no eval split)."""
    n = cfg.data.eval_batches
    return n if available is None else min(n, available)


class Evaluator:
    """Scores a model on eval batches when due (trainer.eval_every_steps, and the last step), and
    tells when an evaluation first reaches trainer.target_auc.

    Args:
        cfg: the run's config (trainer.eval_every_steps, trainer.target_auc, trainer.dense_precision,
            model.tasks).
        device, pg: where the scores are computed, and the training process group.
    """

    def __init__(self, cfg: Config, device: torch.device, pg: dist.ProcessGroup) -> None:
        self.cfg, self.device, self.pg = cfg, device, pg
        self.every = Every(cfg.trainer.eval_every_steps)
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
        tasks = [task.name for task in self.cfg.model.tasks]
        figures = score_on_rank0(torch.cat(list(scored.values()), dim=2), self.pg, tasks)
        figures["periods"] = {p: score_on_rank0(local, self.pg, tasks) for p, local in scored.items()}
        return figures

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, batches: Iterable) -> dict:
        """The figures of `score_on_rank0` over `batches` (this rank's slice of the eval split, at
        least one batch on every rank): `model(batch)` -> (loss, (loss, logits, labels)), logits and labels [B] for
        one task, [B, T] for T, under bf16 autocast as in training. Rank 0 computes the figures on the
        training device; every rank returns them. `model` is back in train mode after."""
        return score_on_rank0(self._scores(model, batches), self.pg, [task.name for task in self.cfg.model.tasks])

    def _scores(self, model: torch.nn.Module, batches: Iterable) -> torch.Tensor:
        """This rank's logits and labels over `batches`: [2, T, N]; [3, T, N] with the rows' sample
        weights (batches that carry them: data.parquet.weight)."""
        bf16 = self.cfg.trainer.dense_precision == "bf16"
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
        target = self.cfg.trainer.target_auc
        auc = evaluation.get("auc")
        if target is None or self.target_step is not None or auc is None or auc < target:
            return False
        self.target_step = step
        return True

    def stalled(self, evaluation: dict, step: int) -> bool:
        """Note `evaluation` (at `step`) for trainer.select_metric; True when trainer.patience
        evaluations in a row have not improved on the best (every rank holds the same figures)."""
        tr, metric = self.cfg.trainer, self.cfg.trainer.select_metric
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

    def target_record(self) -> dict:
        """The summary's target entries ({} without trainer.target_auc)."""
        selection = {}
        if self.cfg.trainer.select_metric is not None:
            selection = {
                "select_metric": self.cfg.trainer.select_metric,
                "best_step": self.best[0] if self.best else None,
                "best_value": self.best[1] if self.best else None,
                "stopped_early": self.stopped_early,
            }
        target = self.cfg.trainer.target_auc
        if target is None:
            return selection
        step = self.target_step
        return {
            **selection,
            "target_auc": target,
            "reached_target": step is not None,
            "steps_to_target": step,
            "samples_to_target": step * self.cfg.data.global_batch_size if step is not None else None,
        }
