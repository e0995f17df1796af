"""Evaluation: AUC, log loss, NE and calibration per task over the eval split at its cadence, and the
stop at a target AUC."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from dlrm.cadence import Every
from dlrm.config import Config
from dlrm.trainer.metrics import score_on_rank0


class Evaluator:
    """Scores the model on the eval split every trainer.eval_every_steps (and at the last step), and
    tells when an evaluation first reaches trainer.target_auc.

    Args:
        cfg: the run's config (data.eval_batches, trainer.eval_every_steps, trainer.target_auc).
        batches: (split, start_step, count) -> this rank's batches (the trainer's, so an injected
            source is used); `num_batches` the eval split's size (None: unbounded).
        forward: batch -> (loss, (loss, logits, labels)), as the training step's: logits and labels
            [B] for one task, [B, T] for T.
        model: -> the module whose train/eval mode is switched around the evaluation.
        device, pg: where the scores are computed, and the training process group.
    """

    def __init__(
        self,
        cfg: Config,
        batches: Callable[[str, int, int | None], Iterator],
        num_batches: Callable[[], int | None],
        forward: Callable,
        model: Callable[[], torch.nn.Module],
        device: torch.device,
        pg: dist.ProcessGroup,
    ) -> None:
        self.cfg, self.device, self.pg = cfg, device, pg
        self._batches, self._num_batches, self._forward, self._model = batches, num_batches, forward, model
        self.every = Every(cfg.trainer.eval_every_steps)
        self.target_step: int | None = None  # the step whose evaluation first reached trainer.target_auc

    def batch_count(self) -> int:
        """The batches an evaluation scores: data.eval_batches, or fewer if the eval split holds fewer (0: none)."""
        available = self._num_batches()
        n = self.cfg.data.eval_batches
        return n if available is None else min(n, available)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """The figures of `score_on_rank0` over the eval split ({} if there is none): every rank scores
        its slice, rank 0 computes them on the training device, every rank returns them."""
        n = self.batch_count()
        if not n:
            return {}
        model = self._model()
        model.eval()
        logits, labels = [], []
        for batch in self._batches("eval", 0, n):
            _, (_, batch_logits, batch_labels) = self._forward(batch.to(self.device, non_blocking=True))
            logits.append(batch_logits.reshape(batch_logits.shape[0], -1))  # [B, T]
            labels.append(batch_labels.reshape(batch_labels.shape[0], -1))
        model.train()
        local = torch.stack((torch.cat(logits).float(), torch.cat(labels).float())).transpose(1, 2)  # [2, T, N]
        return score_on_rank0(local, self.pg, [task.name for task in self.cfg.model.tasks])

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

    def target_record(self) -> dict:
        """The summary's target entries ({} without trainer.target_auc)."""
        target = self.cfg.trainer.target_auc
        if target is None:
            return {}
        step = self.target_step
        return {
            "target_auc": target,
            "reached_target": step is not None,
            "steps_to_target": step,
            "samples_to_target": step * self.cfg.data.global_batch_size if step is not None else None,
        }
