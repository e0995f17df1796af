"""dlrm.comms.accuracy: the geometric-mean absolute error of a cost model (ASTRA-sim's measure)."""

import math

import pytest

from dlrm.comms.accuracy import FLOOR, MIN_BYTES, geomean_abs_error


def test_by_hand():
    # errors 10% and 40% (over and under): geometric mean sqrt(0.1 * 0.4) = 20%
    assert geomean_abs_error([MIN_BYTES, 2 * MIN_BYTES], [1.0, 1.0], [1.1, 0.6]) == pytest.approx(0.2)


def test_small_sizes_are_left_out_and_exact_sizes_floored():
    # the 1 KiB size is 10x off but below MIN_BYTES; the exact one counts as FLOOR
    err = geomean_abs_error([1024, MIN_BYTES, 4 * MIN_BYTES], [1.0, 2.0, 2.0], [10.0, 2.0, 2.2])
    assert err == pytest.approx(math.sqrt(FLOOR * 0.1))


def test_no_size_large_enough():
    assert geomean_abs_error([1024], [1.0], [2.0]) is None
