"""Planning many ranks fast: above LARGE_WORLD ranks `python -m dlrm.plan` narrows TorchRec's search.

TorchRec's planner spends its time estimating every shard of every candidate (table x sharding
type x compute kernel). A row_wise candidate has one shard per rank, so at 1,024 ranks the row_wise
candidates are ~3/4 of all shards estimated, and the default proposers then try many proposals.
Above LARGE_WORLD ranks (proposer 'default' only), `large_world_planner` therefore

- offers the unpinned tables every sharding type but row_wise: at that many ranks a row_wise
  table reduce-scatters the pooled embeddings of the global batch across every node, which
  table_row_wise does inside the node over NVLink and then across nodes by alltoall, so
  table_row_wise is the cheaper of the two (TorchRec's full search picks table_row_wise for every
  table of mlperf_dcnv2 at 1,024 ranks); tables pinned to row_wise keep it;
- uses TorchRec's UniformProposer (one proposal per sharding type) instead of its four proposers.

`--proposer exact` keeps the trainer's planner at any size.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from dlrm.config import Config

LARGE_WORLD = 256  # ranks above which 'default' narrows the search (32 DGX nodes)
SKIPPED_TYPES = ("row_wise", "grid_shard")  # grid_shard: TorchRec enumerates it only when asked


def is_large(world: int, proposer: str) -> bool:
    return proposer == "default" and world > LARGE_WORLD


def large_world_planner(cfg: Config, topology, uniform: bool = True):
    """TorchRec's planner with the narrowed search above; logs one line to stderr saying so."""
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
