"""Managed vocabularies on 2 Gloo ranks: equal to one process on the same global batches (row-wise and
table-wise tables, pipelined), and a checkpoint with the vocabularies' state resumes exactly, on the
same ranks and on another world size and plan.

t_C2 (lfu), t_C3 (distance_lfu, two features) and t_C4 (lru with an age limit: ids age out and come
back, rows are re-assigned and reset) map their ids through vocabularies; t_C1 indexes its table.
"""

import pytest
import torch

from tests.helpers.equivalence import matches, reference, tiny
from tests.helpers.families import PAIR, SINGLE, runs
from tests.helpers.workers import train_and_report, train_losses

VOCAB = (
    "model.tables.1.vocabulary.policy=lfu",
    "model.tables.2.vocabulary.policy=distance_lfu",
    "model.tables.3.vocabulary.policy=lru",
    "model.tables.3.vocabulary.max_age_steps=1",
)


def _resumable(name: str, *overrides: str):
    return tiny(
        *VOCAB,
        "optim=rowwise_adagrad",
        "trainer.max_steps=6",
        "checkpoint.every_steps=3",
        f"checkpoint.dir={PAIR.dir(f'vocab_{name}')}",
        *overrides,
    )


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["row_wise", "table_wise"])
@runs(results=lambda sharding: PAIR.job(train_and_report, tiny(*VOCAB, f"sharding={sharding}")))
def test_vocabularies_on_two_ranks_equal_one_process(sharding, results):
    overrides = tiny(*VOCAB, f"sharding={sharding}")
    ref_losses, ref_state = reference(overrides)
    assert ref_losses[-1] < ref_losses[0], "the reference must learn, or the test proves little"
    ids = ref_state["model.sparse_arch.embedding_bag_collection.remap.tables.t_C4._mch_sorted_raw_ids"]
    assert (ids != torch.iinfo(torch.int64).max).sum() > 10, "the vocabulary admitted ids"
    assert {row["sharding_type"] for row in results[0]["plan"]} == {sharding}
    matches(results, overrides)  # the weights and every vocabulary buffer on every rank
    summary = results[0]["summary"]
    assert 0.0 < summary["eval_auc"] < 1.0


SAVED = PAIR.dir("vocab_whole") / "step_00000003"


@pytest.mark.slow
@runs(
    whole=PAIR.job(train_losses, _resumable("whole", "sharding=row_wise")),
    same=PAIR.job(train_losses, _resumable("same", "sharding=row_wise", f"trainer.resume={SAVED}")),
    other=SINGLE.job(train_losses, _resumable("other", "sharding=table_wise", f"trainer.resume={SAVED}")),
)
def test_vocabulary_state_resumes_exactly_and_on_another_world_size(whole, same, other):
    whole, same, other = whole[0], same[0], other[0]  # rank 0's losses
    assert len(whole) == 6 and same == whole[3:]  # bit-exact on the same ranks
    assert other == pytest.approx(whole[3:], rel=1e-5)  # 1 rank, table-wise: another reduction order
