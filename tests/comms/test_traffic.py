"""The traffic model (dlrm.comms.traffic) against the bytes TorchRec's collectives actually send, on
2 simulated nodes x 2 Gloo ranks: every sharding type, grid shards split over both nodes included."""

from __future__ import annotations

import numpy as np
import pytest

from dlrm.comms.traffic import traffic
from tests.helpers.families import TWO_NODES, Overrides
from tests.helpers.traffic_workers import measured_traffic

GLOBAL_BATCH = 6400  # 1,600 samples per rank: each feature's ids per rank are a multiple of its table's rows
COMMON = [
    "topology=cpu_2x2",
    "model=tiny",
    f"data.global_batch_size={GLOBAL_BATCH}",
    "trainer.pipeline=false",
    "data.eval_batches=0",
    "checkpoint.at_end=false",
    "trainer.tensorboard=false",
]
# Per rank pair and KJT alltoall, TorchRec first exchanges the split sizes (24 bytes here); the model
# leaves them out.
SPLITS_BYTES = 32


MIXED = Overrides(
    *COMMON,
    "sharding.strategy=table_wise",
    "+sharding.per_table.t_C1=row_wise",
    "+sharding.per_table.t_C2=column_wise",
    "+sharding.per_table.t_C3=table_row_wise",
)
# dim 256: the planner splits each grid table into 2 column blocks
GRID = Overrides(
    *COMMON,
    "sharding=grid_shard",
    "+sharding.per_table.t_C4=data_parallel",
    *(f"model.tables.{i}.dim=256" for i in range(4)),
    "model.bottom_mlp=[16,256]",
)
TRAFFIC = TWO_NODES.add("traffic", measured_traffic, 2, MIXED, GRID)


@pytest.mark.slow
def test_modelled_bytes_equal_torchrecs_collectives_per_rank_pair():
    per_rank = TRAFFIC.results()

    for i, overrides in enumerate((MIXED, GRID)):
        tables = per_rank[0][i]["tables"]
        kinds = {t.sharding_type for t in tables}
        if overrides is GRID:  # grid shards on both nodes: the cross-node alltoall is exercised
            assert kinds == {"grid_shard", "data_parallel"}
            assert {s.col_offset for t in tables if t.sharding_type == "grid_shard" for s in t.shards} == {0, 128}
        else:
            assert kinds == {"row_wise", "column_wise", "table_row_wise", "table_wise"}
        model = traffic(tables, 4, 2, GLOBAL_BATCH)
        pooled = np.stack([r[i]["sent"]["float"] for r in per_rank])  # [src, dst] bytes per step
        ids = np.stack([r[i]["sent"]["int"] for r in per_rank])
        np.testing.assert_array_equal(pooled, model["pooled_fwd"] + model["pooled_bwd"])
        others = ~np.eye(4, dtype=bool)
        alltoalls = len(kinds - {"data_parallel"})
        extra = (ids - model["ids"])[others]
        assert (extra >= 0).all() and (extra <= SPLITS_BYTES * alltoalls).all(), (ids, model["ids"])
        assert model["ids"][others].min() > 100 * SPLITS_BYTES * alltoalls  # so the bound is tight
