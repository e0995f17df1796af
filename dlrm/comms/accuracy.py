"""How far a fitted cost model is from measured times: the geometric-mean absolute error.

ASTRA-sim reports its accuracy against real systems as the geometric mean, over message sizes, of
|predicted - measured| / measured (9.7% / 12.0% / 20.6% at 8 / 4 / 2 GPUs). The geometric mean keeps
one far-off size from dominating, as the arithmetic mean would; an error of exactly 0 would make it
0, so each error is floored at FLOOR (0.1%, well below timing noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_BYTES = 64 * 2**10  # sizes below are latency-bound and noisy on Gloo: left out, as in the issue
FLOOR = 1e-3


def geomean_abs_error(
    sizes: Sequence[float], measured: Sequence[float], predicted: Sequence[float], min_bytes: float = MIN_BYTES
) -> float | None:
    """Geometric mean of |predicted / measured - 1| over sizes >= min_bytes; None when there are none."""
    errs = [max(abs(p / m - 1.0), FLOOR) for n, m, p in zip(sizes, measured, predicted, strict=True) if n >= min_bytes]
    if not errs:
        return None
    return math.exp(sum(math.log(e) for e in errs) / len(errs))
