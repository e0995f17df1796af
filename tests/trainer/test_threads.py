"""Intra-op threads per rank (dlrm.trainer.threads): an equal share of the cores, the user's choice first."""

import pytest
import torch

from dlrm.config import ConfigError, TrainerConfig
from dlrm.trainer.threads import apply_intra_op_threads, choose_intra_op_threads, intra_op_threads


@pytest.mark.parametrize(
    "cores, ranks, threads", [(2, 1, 2), (2, 2, 1), (16, 2, 8), (16, 3, 5), (2, 8, 1), (1, 1, 1), (64, 0, 64)]
)
def test_each_rank_gets_an_equal_share_of_the_cores(cores, ranks, threads):
    assert intra_op_threads(cores, ranks) == threads


def test_without_a_choice_the_share_is_set_and_the_reason_says_so():
    threads, why = choose_intra_op_threads(None, {}, current=16, cores=16, local_ranks=4)
    assert threads == 4 and "16 cores / 4 ranks" in why


@pytest.mark.parametrize(
    "configured, env, current, expected, named",
    [
        (3, {"OMP_NUM_THREADS": "1"}, 16, 3, "trainer.intra_op_threads=3"),  # the config key first
        (None, {"OMP_NUM_THREADS": "6"}, 6, None, "OMP_NUM_THREADS=6"),  # the environment's: torch applied it
        (None, {"MKL_NUM_THREADS": "2"}, 16, None, "MKL_NUM_THREADS=2"),
        (None, {"OMP_NUM_THREADS": ""}, 5, None, "torch.set_num_threads"),  # empty: not a choice; a call was
    ],
)
def test_the_users_choice_wins(configured, env, current, expected, named):
    threads, why = choose_intra_op_threads(configured, env, current=current, cores=16, local_ranks=2)
    assert threads == expected and named in why


def test_applied_and_logged(caplog):
    before = torch.get_num_threads()
    try:
        with caplog.at_level("INFO", logger="dlrm.trainer.threads"):
            assert apply_intra_op_threads(1, local_ranks=2, env={}) == 1 == torch.get_num_threads()
        assert [r.getMessage() for r in caplog.records] == ["intra-op threads per rank: 1 (trainer.intra_op_threads=1)"]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", [0, -2])
def test_a_non_positive_count_is_refused(value):
    with pytest.raises(ConfigError, match="trainer.intra_op_threads"):
        TrainerConfig(intra_op_threads=value).check()
