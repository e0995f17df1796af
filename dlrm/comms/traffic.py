"""Bytes a sharding plan moves per training step, rank to rank, and their modelled time.

`traffic` is the embedding exchange of each sharding type as a [world, world] matrix of bytes;
`comm_summary` splits it into intra- and inter-node bytes per rank, adds the allreduce of the dense
gradients and data-parallel tables, and times the busiest rank with `dlrm.comms.costmodel`.

On Gloo, whose reduce-scatter is a whole allreduce (`dlrm.comms.costmodel`'s docstring), a reduce-scatter
among the ranks of one node (table_row_wise, grid_shard; row_wise on one node) also sends each reduced
chunk back, the allreduce's allgather half: twice the bytes, exactly what its ring sends. Not modelled:
a reduce-scatter spanning nodes (row_wise) runs as Gloo's flat ring allreduce, whose uplink carries
2(p-1)/p n per node instead of the pairwise (p-g)/p n per rank counted here (1.5x the time at 2 x 2),
and its backward allgather as a ring (0.75x); the two together, 1.125x the pairwise figure at 2 x 2.
"""

from __future__ import annotations

import numpy as np

from dlrm.comms.costmodel import backend_of, step_comm_time
from dlrm.config import Config
from dlrm.config.choices import Precision
from dlrm.distributed.plan_records import Shard, TablePlan

FLOAT_BYTES = 4  # pooled embeddings, their gradients and dense gradients in fp32
LENGTH_BYTES = 4  # int32 lengths in the input KeyedJaggedTensor (both data sources)


def id_bytes(tables: list[TablePlan]) -> int:
    """Bytes per id in the input KeyedJaggedTensor: int32 when every table's ids fit (as both data
    sources do: `dlrm.data.synthetic`, `dlrm.data.criteo.format`), else int64."""
    return 4 if max((t.rows for t in tables), default=0) <= 2**31 else 8


def traffic(tables: list[TablePlan], world: int, ranks_per_node: int, global_batch: int, split: bool = False):
    """Bytes per iteration (forward + backward) rank i sends to rank j: T[i, j], split by kind.

    B_l = global_batch / world samples per rank; per table: F features, L ids per sample per feature,
    dim D. Ids take `id_bytes`, lengths 4 bytes, pooled embeddings and their gradients 4 bytes per
    element. Ids are assumed spread over the rows in proportion to the shards' rows (their
    expectation when ids are uniform), so a row-sharded table gets a share of the ids equal to its
    share of the rows. Per sharding type, as TorchRec's sharding modules exchange them:

    - table_wise / column_wise / table_column_wise: each shard's rank gets every rank's ids of the
      table (B_l F L ids) and their lengths (B_l F), and sends every other rank its B_l x F x cols
      pooled slice; the backward sends the gradients of those slices back (same bytes, reversed).
    - row_wise (across all ranks): ids are bucketised by row range to the shards, each shard rank
      getting all B_l F lengths; each shard computes partial sums for the global batch and
      reduce-scatters them (sends B_l F D to each other shard rank); the backward allgathers the
      gradients (same bytes, reversed).
    - table_row_wise / grid_shard (each column block row-sharded over the ranks of one node): ids and
      lengths as for row_wise; intra-node reduce-scatter (each shard sends (B / g) F D to each other
      shard of its node), then cross-node alltoall among ranks of the same local index (B_l F D to
      each); backward reversed (TorchRec's GridPooledEmbeddingDist, TwRwPooledEmbeddingDist).
    - data_parallel: no alltoall (its gradients are allreduced, see `allreduce_bytes`).
    Not modelled: the split sizes each KJT alltoall exchanges first (a few integers per rank pair).
    tests/comms/test_traffic.py counts TorchRec's actual collectives on 2 nodes x 2 ranks:
    the pooled bytes match exactly, ids and lengths to within those split sizes.
    Returns {"ids": T, "pooled_fwd": T, "pooled_bwd": T} (numpy arrays [world, world], diagonal 0;
    "ids" holds ids and lengths); with split=True also "reduce_scatter_in_node": the part of
    "pooled_fwd" that reduce-scatters among the ranks of one node send.
    """
    p, g = world, ranks_per_node
    b_local = global_batch / p
    ids = np.zeros((p, p))
    fwd = np.zeros((p, p))
    rs = np.zeros((p, p))  # the part of fwd sent by reduce-scatters among the ranks of one node
    node = np.arange(p) // g
    others = ~np.eye(p, dtype=bool)
    per_id = id_bytes(tables)
    for t in tables:
        kind = t.sharding_type
        if kind == "data_parallel":
            continue
        F, L, rows = t.features, t.pooling, t.rows
        table_ids = b_local * F * L * per_id  # one rank's ids of this table
        lengths = b_local * F * LENGTH_BYTES  # one rank's lengths of this table's features
        if kind in ("table_wise", "column_wise", "table_column_wise"):
            for s in t.shards:
                ids[:, s.rank] += table_ids + lengths
                fwd[s.rank, :] += b_local * F * s.cols * FLOAT_BYTES
            continue
        # row-sharded: group shards by column block (grid_shard has several), each group row-sharded
        groups: dict[int, list[Shard]] = {}
        for s in t.shards:
            groups.setdefault(s.col_offset, []).append(s)
        for group in groups.values():
            cols = group[0].cols
            for s in group:
                ids[:, s.rank] += table_ids * s.rows / rows + lengths
            ranks = [s.rank for s in group]
            nodes_of_group = {int(node[r]) for r in ranks}
            if kind in ("table_row_wise", "grid_shard") and len(nodes_of_group) == 1:
                n_ranks = len(ranks)
                for r in ranks:
                    for r2 in ranks:  # intra-node reduce-scatter of the global batch's partial sums
                        if r2 != r:
                            rs[r, r2] += global_batch / n_ranks * F * cols * FLOAT_BYTES
                    same_local = [d for d in range(p) if d % g == r % g and node[d] != node[r]]
                    fwd[r, same_local] += b_local * F * cols * FLOAT_BYTES  # cross-node alltoall
            else:  # row_wise: reduce-scatter over the shard ranks of every rank's B_l slice
                to = rs if len(nodes_of_group) == 1 else fwd
                for r in ranks:
                    to[r, :] += b_local * F * cols * FLOAT_BYTES
    ids *= others
    rs *= others
    fwd = fwd * others + rs
    out = {"ids": ids, "pooled_fwd": fwd, "pooled_bwd": fwd.T.copy()}
    return {**out, "reduce_scatter_in_node": rs} if split else out


def comm_summary(cfg: Config, tables: list[TablePlan], world: int, ranks_per_node: int, dense_params: int) -> dict:
    """Per-rank, per-iteration bytes (sent and received, intra- and inter-node) and modelled seconds.

    The estimate uses the busiest rank (max over ranks of bytes sent or received at each level),
    since every rank waits for the slowest in a collective. Pooled embeddings and their gradients
    travel in sharding.qcomms_forward / qcomms_backward, the allreduce in trainer.dense_allreduce_precision
    (flat or hierarchical as trainer.dense_allreduce). On Gloo "pooled_fwd" also holds the return half of
    the reduce-scatters among the ranks of one node (module docstring): their bytes, reversed, once more.
    """
    p, g = world, ranks_per_node
    mats = traffic(tables, p, g, cfg.data.global_batch_size, split=True)
    rs = mats.pop("reduce_scatter_in_node")
    if backend_of(cfg.topology) == "gloo":
        mats["pooled_fwd"] += rs.T
    mats["pooled_fwd"] *= Precision(cfg.sharding.qcomms_forward).itemsize / FLOAT_BYTES  # quantized comms
    mats["pooled_bwd"] *= Precision(cfg.sharding.qcomms_backward).itemsize / FLOAT_BYTES
    total = sum(mats.values())
    node = np.arange(p) // g
    same = node[:, None] == node[None, :]
    sent_intra = (total * same).sum(axis=1)
    sent_inter = (total * ~same).sum(axis=1)
    recv_intra = (total * same).sum(axis=0)
    recv_inter = (total * ~same).sum(axis=0)
    dp_params = sum(t.rows * t.dim for t in tables if t.sharding_type == "data_parallel")
    allreduce = Precision(cfg.trainer.dense_allreduce_precision).itemsize * (dense_params + dp_params)  # DDP's buckets
    busiest_intra = float(max(sent_intra.max(), recv_intra.max()))
    busiest_inter = float(max(sent_inter.max(), recv_inter.max()))
    times = step_comm_time(
        cfg.topology,
        alltoall_bytes_intra=busiest_intra if g > 1 else 0.0,
        alltoall_bytes_inter=busiest_inter if cfg.topology.nodes > 1 else 0.0,
        allreduce_bytes=allreduce,
        ranks_per_node=g,
        alltoall_count=alltoalls_per_step(cfg),
        dense_allreduce=str(cfg.trainer.dense_allreduce),
    )
    by_kind = {
        k: {"intra": float((m * same).sum() / p), "inter": float((m * ~same).sum() / p)} for k, m in mats.items()
    }
    return {
        "global_batch_size": cfg.data.global_batch_size,
        "local_batch_size": cfg.data.global_batch_size // p,
        "alltoall_bytes_intra_mean": float(sent_intra.mean()),
        "alltoall_bytes_inter_mean": float(sent_inter.mean()),
        "alltoall_bytes_intra_max": busiest_intra,
        "alltoall_bytes_inter_max": busiest_inter,
        "alltoall_bytes_by_kind_mean": by_kind,
        "allreduce_bytes": allreduce,
        "allreduce_dense_params": dense_params,
        "allreduce_data_parallel_table_params": dp_params,
        "per_rank": [
            {
                "rank": r,
                "sent_intra": float(sent_intra[r]),
                "sent_inter": float(sent_inter[r]),
                "recv_intra": float(recv_intra[r]),
                "recv_inter": float(recv_inter[r]),
            }
            for r in range(p)
        ],
        "time_s": times,
    }


def alltoalls_per_step(cfg: Config) -> int:
    """The alltoalls a training step issues, each paying its latency: TorchRec's input distribution
    sends the KJT's splits, lengths and values (and per-id weights) in one collective each, then the
    pooled embeddings go forward and their gradients backward (5 a step, counted in a profiled trace
    of the main job; 6 weighted)."""
    return 5 + int(cfg.model.weighted)
