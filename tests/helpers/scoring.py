"""Reference scoring: AUC in numpy, NE and calibration as TorchRec's metrics compute them."""

import numpy as np
import torch


def numpy_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Reference: P(score+ > score-) + P(score+ == score-) / 2, by sorting the negatives."""
    pos, neg = np.sort(scores[labels == 1]), np.sort(scores[labels == 0])
    below = np.searchsorted(neg, pos, side="left")
    at_or_below = np.searchsorted(neg, pos, side="right")
    return float((below + (at_or_below - below) / 2).sum() / (len(pos) * len(neg)))


def torchrec_ne_and_calibration(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor
) -> tuple[float, float]:
    """NE and calibration of `logits` [N] for `labels` [N] with sample `weights` [N], by TorchRec's
    NEMetric and CalibrationMetric state functions (float64)."""
    from torchrec.metrics.calibration import compute_calibration, get_calibration_states
    from torchrec.metrics.ne import compute_ne, get_ne_states

    p, y, w = torch.sigmoid(logits.double()), labels.double(), weights.double()
    s = get_ne_states(y, p.clone(), w, 1e-12)
    ne = compute_ne(s["cross_entropy_sum"], s["weighted_num_samples"], s["pos_labels"], s["neg_labels"], 1e-12)
    cal = get_calibration_states(y, p, w)
    return ne.item(), compute_calibration(cal["calibration_num"], cal["calibration_denom"]).item()
