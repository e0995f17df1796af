"""Simulated 2 nodes x 2 ranks: process-group layout, hierarchical allreduce, sharded equivalence."""

import pytest

from tests.helpers.equivalence import assert_matches_reference, config
from tests.helpers.harness import launch
from tests.helpers.reference import train_unsharded
from tests.helpers.workers import hierarchical_vs_flat, process_group_layout, train_and_report


@pytest.mark.slow
def test_process_groups_follow_the_topology():
    layouts = launch(process_group_layout, 2, 2, 2, nnodes=2)
    for rank, layout in enumerate(layouts):
        node, local = divmod(rank, 2)
        assert layout["intra_node"] == [2 * node, 2 * node + 1]
        assert layout["inter_node"] == [local, 2 + local]


@pytest.mark.slow
def test_hierarchical_allreduce_equals_flat():
    assert max(launch(hierarchical_vs_flat, 2, 2, 2, nnodes=2)) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize(
    "sharding,allreduce",
    [
        ("table_wise", "hierarchical"),
        ("row_wise", "flat"),
        ("column_wise", "flat"),
        ("table_row_wise", "hierarchical"),
        ("data_parallel", "hierarchical"),
        ("mixed", "flat"),
        ("grid_shard", "flat"),
    ],
)
def test_two_nodes_of_two_ranks_equal_one_process(make_config, sharding, allreduce):
    cfg = config(make_config, "topology=cpu_2x2", f"sharding={sharding}", f"trainer.dense_allreduce={allreduce}")
    ref_losses, ref_weights = train_unsharded(cfg)
    results = launch(train_and_report, 2, cfg, nnodes=2)
    planned = {row["table"]: row["sharding_type"] for row in results[0]["plan"]}
    assert planned == {t.name: cfg.sharding.per_table.get(t.name, cfg.sharding.strategy) for t in cfg.model.tables}
    assert_matches_reference(results, ref_losses, ref_weights)
