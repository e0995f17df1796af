"""How far a fitted cost model is from measured times: the geometric-mean absolute relative error.

The geometric mean keeps one far-off size from dominating; each error is floored at FLOOR so that an
exact match does not make it 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_BYTES = 64 * 2**10  # sizes below are latency-bound and noisy on Gloo: left out
FLOOR = 1e-3


def geomean_abs_error(
    sizes: Sequence[float], measured: Sequence[float], predicted: Sequence[float], min_bytes: float = MIN_BYTES
) -> float | None:
    """Geometric mean of |predicted / measured - 1| over the sizes of at least `min_bytes`.

    Args:
        sizes, measured, predicted: per message size, its bytes and its measured and predicted seconds.
        min_bytes: smaller (latency-bound, noisy) sizes are left out.

    Returns:
        The error as a fraction, or None when no size is large enough.
    """
    errs = [max(abs(p / m - 1.0), FLOOR) for n, m, p in zip(sizes, measured, predicted, strict=True) if n >= min_bytes]
    if not errs:
        return None
    return math.exp(sum(math.log(e) for e in errs) / len(errs))
