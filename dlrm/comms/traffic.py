"""Bytes a sharding plan moves per training step, rank to rank, and their modelled time.

`traffic` is the embedding exchange of each sharding type as a [world, world] matrix of bytes;
`comm_summary` splits it into intra- and inter-node bytes per rank, adds the allreduce of dense
gradients and data-parallel tables, and times the busiest rank with the cost model. On Gloo, a
reduce-scatter inside one node also sends each chunk back (twice the bytes); one spanning nodes is
counted pairwise, not as Gloo's flat ring.
"""

# Gloo's reduce-scatter and what is not modelled: docs/design/cost-model.md.
from __future__ import annotations

import numpy as np

from dlrm.comms.costmodel import backend_of, step_comm_time
from dlrm.config import Config
from dlrm.config.choices import Precision
from dlrm.distributed.plan_records import Shard, TablePlan

FLOAT_BYTES = 4  # pooled embeddings, their gradients and dense gradients in fp32
LENGTH_BYTES = 4  # int32 lengths in the input KeyedJaggedTensor (both data sources)


def id_bytes(tables: list[TablePlan]) -> int:
    """Bytes per id in the input KeyedJaggedTensor: 4 when every table's ids fit int32, else 8."""
    return 4 if max((t.rows for t in tables), default=0) <= 2**31 else 8


def traffic(tables: list[TablePlan], world: int, ranks_per_node: int, global_batch: int, split: bool = False):
    """Bytes per iteration (forward + backward) rank i sends to rank j, by kind.

    B_l = global_batch / world samples per rank; per table F features, L ids per sample per feature, dim D.
    Ids take `id_bytes`, lengths 4 bytes, pooled embeddings and their gradients 4 bytes per element. Ids
    spread over a row-sharded table's shards in proportion to their rows. Per sharding type:

    - table_wise / column_wise / table_column_wise: the shard's rank gets every rank's B_l F L ids and
      B_l F lengths, and sends each other rank its B_l x F x cols pooled slice; backward reversed.
    - row_wise: ids bucketised by row range; each shard reduce-scatters its partial sums (B_l F D to
      each other shard rank); backward allgathers.
    - table_row_wise / grid_shard: row_wise within one node (reduce-scatter of (B / g) F D to each
      shard of the node), then alltoall among ranks of one local index (B_l F D each); backward reversed.
    - data_parallel: no alltoall (its gradients are allreduced).

    The split sizes each KJT alltoall exchanges first (a few integers per rank pair) are not modelled.

    Args:
        tables: the plan's tables.
        world, ranks_per_node: the launch's shape.
        global_batch: samples per step over all ranks.
        split: also return the reduce-scatter part.

    Returns:
        {"ids", "pooled_fwd", "pooled_bwd"}: numpy arrays [world, world] of bytes, diagonal 0 ("ids"
        holds ids and lengths); with split=True also "reduce_scatter_in_node", the part of "pooled_fwd"
        sent by reduce-scatters inside one node.
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

    The busiest rank counts (max over ranks at each level): every rank waits for the slowest. Pooled
    embeddings and gradients travel in the configured qcomms precisions, the allreduce in the dense
    allreduce's precision and scheme.

    Args:
        cfg: the run's config.
        tables: the plan's tables.
        world, ranks_per_node: the launch's shape.
        dense_params: dense parameters (plus data-parallel table elements) to allreduce.

    Returns:
        A dict of byte counts and the `step_comm_time` seconds.
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
    """The alltoalls one training step issues: the KJT's splits, lengths and values (and weights),
    then pooled embeddings forward and their gradients backward (5, or 6 with per-id weights).
    """
    return 5 + int(cfg.model.weighted)
