"""The traffic model (dlrm.comms.traffic) against the bytes TorchRec's collectives actually send, on
2 simulated nodes x 2 Gloo ranks: every sharding type, grid shards split over both nodes included."""

from __future__ import annotations

import gc
from contextlib import ExitStack
from unittest import mock

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.comms.traffic import traffic
from dlrm.config import Config, validate, validate_world
from dlrm.distributed.sharding import table_plans
from dlrm.distributed.world import World
from tests.helpers.families import TWO_NODES, Overrides, runs

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


class SentBytes:
    """Counts the bytes this rank sends to every rank, [world] per kind ("float": pooled embeddings
    and their gradients; "int": ids, lengths and split sizes), by wrapping torch.distributed's
    collectives (TorchRec calls them through the module, so the wrappers see every call)."""

    def __init__(self, world: int, rank: int) -> None:
        self.rank = rank
        self.world = world
        self.sent = {"float": np.zeros(world), "int": np.zeros(world)}

    def _add(self, group, tensor: torch.Tensor, per_member: list[float]) -> None:
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(self.world))
        kind = "float" if tensor.is_floating_point() else "int"
        for member, nbytes in zip(ranks, per_member, strict=True):
            if member != self.rank:
                self.sent[kind][member] += nbytes

    def patches(self) -> dict:
        def members(group) -> int:
            return dist.get_world_size(group)

        def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
            n = members(group)
            row = input.element_size() * (input[0].numel() if input.dim() > 1 else 1)
            splits = input_split_sizes if input_split_sizes is not None else [input.size(0) // n] * n
            self._add(group, input, [s * row for s in splits])
            return original["all_to_all_single"](output, input, output_split_sizes, input_split_sizes, group, **kw)

        def reduce_scatter(output, input_list, *args, group=None, **kw):
            self._add(group, output, [t.numel() * t.element_size() for t in input_list])
            return original["reduce_scatter"](output, input_list, *args, group=group, **kw)

        def reduce_scatter_tensor(output, input, *args, group=None, **kw):
            n = members(group)
            self._add(group, input, [input.numel() * input.element_size() / n] * n)
            return original["reduce_scatter_tensor"](output, input, *args, group=group, **kw)

        def all_gather(tensor_list, tensor, group=None, **kw):
            self._add(group, tensor, [tensor.numel() * tensor.element_size()] * members(group))
            return original["all_gather"](tensor_list, tensor, group=group, **kw)

        def all_gather_into_tensor(output, input, group=None, **kw):
            self._add(group, input, [input.numel() * input.element_size()] * members(group))
            return original["all_gather_into_tensor"](output, input, group=group, **kw)

        wrappers = {
            "all_to_all_single": all_to_all_single,
            "reduce_scatter": reduce_scatter,
            "reduce_scatter_tensor": reduce_scatter_tensor,
            "all_gather": all_gather,
            "all_gather_into_tensor": all_gather_into_tensor,
        }
        original = {name: getattr(dist, name) for name in wrappers}
        return wrappers


def uniform_ids(batch: Batch, table_rows: dict[str, int], rank: int) -> Batch:
    """The batch with each feature's ids replaced by consecutive ids (mod the table's rows), so a
    row shard receives exactly its share of the rows when a rank's ids of a feature are a multiple of them."""
    kjt = batch.sparse_features
    values = []
    for key, lengths in zip(kjt.keys(), kjt.length_per_key(), strict=True):
        rows = table_rows[key]
        values.append((torch.arange(lengths) + rank * lengths) % rows)
    ids = torch.cat(values).to(kjt.values().dtype)
    sparse = KeyedJaggedTensor(keys=kjt.keys(), values=ids, lengths=kjt.lengths())
    return Batch(dense_features=batch.dense_features, sparse_features=sparse, labels=batch.labels)


def measured_traffic(steps: int, *cfgs: Config) -> list[dict]:
    """On each rank, for each config in turn: train `steps` steps without the pipeline on uniform ids; the bytes
    this rank sent per step to each rank (by kind), the plan (dlrm.distributed.sharding.table_plans) and
    the batch's id/length dtypes."""
    from dlrm.trainer.build import build

    world = World.from_env()
    results = []
    for cfg in cfgs:
        validate(cfg)
        validate_world(cfg, world.world_size, world.local_world_size)
        results.append(_sent_per_step(build(cfg, world), cfg, world, steps))
        gc.collect()
    return results


def _sent_per_step(trainer, cfg: Config, world: World, steps: int) -> dict:
    rows = {f: t.rows for t in cfg.model.tables for f in t.features}
    batches = trainer.source.batches("train", world.rank, world.world_size, 0)
    counter = SentBytes(world.world_size, world.rank)
    dtypes = {}
    with ExitStack() as stack:
        for name, wrapper in counter.patches().items():  # torch.distributed's collectives, counting
            stack.enter_context(mock.patch.object(dist, name, wrapper))
        for _ in range(steps):
            batch = uniform_ids(next(batches), rows, world.rank)
            dtypes = {"ids": batch.sparse_features.values().dtype, "lengths": batch.sparse_features.lengths().dtype}
            trainer.train_step(batch)
    return {
        "sent": {k: v / steps for k, v in counter.sent.items()},
        "tables": table_plans(trainer.plan, cfg.model, world.world_size),
        "dtypes": dtypes,
    }


@pytest.mark.slow
@runs(per_rank=TWO_NODES.job(measured_traffic, 2, MIXED, GRID))
def test_modelled_bytes_equal_torchrecs_collectives_per_rank_pair(per_rank):

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
