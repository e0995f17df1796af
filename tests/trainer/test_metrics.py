"""Evaluation metrics: our AUC equals torchmetrics' on ties, imbalance and random scores."""

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from dlrm.trainer.metrics import auc_and_logloss, exact_auc


@pytest.mark.parametrize("levels", [0, 3, 50])  # 0: continuous scores; else that many distinct values
@pytest.mark.parametrize("positive_rate", [0.03, 0.5])
def test_exact_auc_equals_torchmetrics(levels, positive_rate):
    gen = torch.Generator().manual_seed(levels)
    n = 4000
    labels = (torch.rand(n, generator=gen) < positive_rate).float()
    scores = torch.rand(n, generator=gen) + 0.3 * labels  # learnable: AUC well above 0.5
    if levels:
        scores = torch.round(scores * levels) / levels  # many ties
    # Both are exact areas (ranks vs trapezoids over the same thresholds): fp32/fp64 rounding only.
    assert exact_auc(scores, labels).item() == pytest.approx(binary_auroc(scores, labels.long()).item(), abs=1e-6)


def test_exact_auc_extremes():
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert exact_auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels).item() == 1.0
    assert exact_auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels).item() == 0.0
    assert exact_auc(torch.full((4,), 0.5), labels).item() == 0.5  # all tied


def test_auc_and_logloss_one_class_has_no_auc():
    auc, logloss = auc_and_logloss(torch.zeros(3), torch.ones(3))
    assert auc is None and logloss == pytest.approx(0.6931472)
