"""Reference scoring in numpy, for the AUC tests."""

import numpy as np


def numpy_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Reference: P(score+ > score-) + P(score+ == score-) / 2, by sorting the negatives."""
    pos, neg = np.sort(scores[labels == 1]), np.sort(scores[labels == 0])
    below = np.searchsorted(neg, pos, side="left")
    at_or_below = np.searchsorted(neg, pos, side="right")
    return float((below + (at_or_below - below) / 2).sum() / (len(pos) * len(neg)))
