"""Simulated 2 nodes x 2 ranks: process-group layout, hierarchical allreduce, sharded equivalence.

The runs are jobs of the 2 x 2 family (tests/helpers/families.py): one launch for the session.
"""

import pytest
import torch

from dlrm.config.compose import compose
from dlrm.distributed.dense_sync import hierarchical_allreduce_
from dlrm.distributed.topology import build_process_groups
from tests.helpers.equivalence import matches, tiny
from tests.helpers.families import TWO_NODES, runs
from tests.helpers.harness import default_group
from tests.helpers.workers import train_and_report

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


def process_group_layout(nodes: int, ranks_per_node: int) -> dict:
    """On each rank: the global ranks in this rank's intra-node and inter-node groups."""
    default_group()
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    layout = {
        "intra_node": torch.distributed.get_process_group_ranks(groups.intra_node),
        "inter_node": torch.distributed.get_process_group_ranks(groups.inter_node),
    }
    return layout


@pytest.mark.slow
@runs(layouts=TWO_NODES.job(process_group_layout, 2, 2))
def test_process_groups_follow_the_topology(layouts):
    for rank, layout in enumerate(layouts):
        node, local = divmod(rank, 2)
        assert layout["intra_node"] == [2 * node, 2 * node + 1]
        assert layout["inter_node"] == [local, 2 + local]


def hierarchical_vs_flat(nodes: int, ranks_per_node: int) -> float:
    """On each rank: max |hierarchical - flat| over a few rank-dependent tensors (sizes not divisible by g too)."""
    default_group()
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    rank = torch.distributed.get_rank()
    worst = 0.0
    for n in (1, 7, 1000, 4099):
        t = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + n))
        flat = t.clone()
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        worst = max(worst, (hierarchical_allreduce_(t, groups) - flat).abs().max().item())
    return worst


@pytest.mark.slow
@runs(differences=TWO_NODES.job(hierarchical_vs_flat, 2, 2))
def test_hierarchical_allreduce_equals_flat(differences):
    assert max(differences) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("sharding,allreduce", CASES)
@runs(results=lambda sharding, allreduce: TWO_NODES.job(train_and_report, _overrides(sharding, allreduce)))
def test_two_nodes_of_two_ranks_equal_one_process(sharding, allreduce, results):
    overrides = _overrides(sharding, allreduce)
    cfg = compose(list(overrides))
    planned = {row["table"]: row["sharding_type"] for row in results[0]["plan"]}
    assert planned == {t.name: cfg.sharding.per_table.get(t.name, cfg.sharding.strategy) for t in cfg.model.tables}
    matches(results, overrides)
