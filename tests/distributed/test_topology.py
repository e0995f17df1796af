"""Simulated 2 nodes x 2 ranks: process-group layout, hierarchical allreduce, sharded equivalence.

The runs are jobs of the 2 x 2 family (tests/helpers/families.py): one launch for the session.
"""

import pytest

from dlrm.config.compose import compose
from tests.helpers.equivalence import matches, tiny
from tests.helpers.families import TWO_NODES
from tests.helpers.workers import hierarchical_vs_flat, process_group_layout, train_and_report

CASES = [
    ("table_wise", "hierarchical"),
    ("row_wise", "flat"),
    ("column_wise", "flat"),
    ("table_row_wise", "hierarchical"),
    ("data_parallel", "hierarchical"),
    ("mixed", "flat"),
    ("grid_shard", "flat"),
]


def _overrides(sharding, allreduce):
    return tiny("topology=cpu_2x2", f"sharding={sharding}", f"trainer.dense_allreduce={allreduce}")


LAYOUT = TWO_NODES.add("layout", process_group_layout, 2, 2)
HIERARCHICAL_VS_FLAT = TWO_NODES.add("hierarchical_vs_flat", hierarchical_vs_flat, 2, 2)
RUNS = {case: TWO_NODES.add(f"2x2/{case[0]}/{case[1]}", train_and_report, _overrides(*case)) for case in CASES}


@pytest.mark.slow
def test_process_groups_follow_the_topology():
    for rank, layout in enumerate(LAYOUT.results()):
        node, local = divmod(rank, 2)
        assert layout["intra_node"] == [2 * node, 2 * node + 1]
        assert layout["inter_node"] == [local, 2 + local]


@pytest.mark.slow
def test_hierarchical_allreduce_equals_flat():
    assert max(HIERARCHICAL_VS_FLAT.results()) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("sharding,allreduce", CASES)
def test_two_nodes_of_two_ranks_equal_one_process(sharding, allreduce):
    overrides = _overrides(sharding, allreduce)
    cfg = compose(list(overrides))
    results = RUNS[sharding, allreduce].results()
    planned = {row["table"]: row["sharding_type"] for row in results[0]["plan"]}
    assert planned == {t.name: cfg.sharding.per_table.get(t.name, cfg.sharding.strategy) for t in cfg.model.tables}
    matches(results, overrides)
