"""Planning many ranks fast: above LARGE_WORLD ranks the 'default' proposer narrows TorchRec's search.

Above LARGE_WORLD ranks, unpinned tables are offered every sharding type but row_wise (table_row_wise
is the cheaper of the two there), and TorchRec's UniformProposer replaces its four proposers.
`--proposer exact` keeps the trainer's planner at any size.
"""

# Why row_wise is left out and the measured speed-up: docs/design/planning.md.
from __future__ import annotations

import sys
from dataclasses import replace

from dlrm.config import Config

LARGE_WORLD = 256  # ranks above which 'default' narrows the search (32 DGX nodes)
SKIPPED_TYPES = ("row_wise", "grid_shard")  # grid_shard: TorchRec enumerates it only when asked


def is_large(world: int, proposer: str) -> bool:
    """Whether `world` ranks with `proposer` take the narrowed search."""
    return proposer == "default" and world > LARGE_WORLD


def large_world_planner(cfg: Config, topology, uniform: bool = True):
    """TorchRec's planner with the narrowed search; logs one line to stderr saying so."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from dlrm.distributed.sharding import AnyDeviceEmbeddingBagCollectionSharder, OrderedUniformProposer, constraints

    kinds = [k for k in AnyDeviceEmbeddingBagCollectionSharder().sharding_types("cuda") if k not in SKIPPED_TYPES]
    pinned = constraints(cfg, topology.world_size)
    narrowed = {name: c if c.sharding_types else replace(c, sharding_types=list(kinds)) for name, c in pinned.items()}
    print(
        f"planning {topology.world_size} ranks (> {LARGE_WORLD}): TorchRec's uniform proposer, no row_wise "
        "candidates for unpinned tables (dlrm.plan.large); --proposer exact runs the trainer's full search",
        file=sys.stderr,
    )
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=cfg.data.global_batch_size // topology.world_size,
        constraints=narrowed,
        proposer=OrderedUniformProposer() if uniform else None,
    )
