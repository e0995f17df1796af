"""Functions run on each rank by the distributed tests (importable, so spawn can pickle them)."""

from __future__ import annotations

import gc

import torch

from dlrm.config import Config, validate, validate_world
from dlrm.core.model import local_pieces
from dlrm.core.sharding import describe_plan
from dlrm.core.topology import World


def train_and_report(cfg: Config) -> dict:
    """Train on this rank; return the logged losses and this rank's pieces of the final weights.

    pieces: {param name: [((row offset, col offset), tensor), ...]}; plan: dlrm.core.sharding.describe_plan
    """
    from dlrm.core.trainer import Trainer

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    trainer = Trainer(cfg, world)
    trainer.train()
    model = trainer.detached_model()
    pieces = {
        name: [(offsets, t.detach().clone()) for t, offsets, _ in local_pieces(value)]
        for name, value in model.state_dict().items()
    }
    result = {"losses": trainer.losses, "pieces": pieces, "plan": describe_plan(trainer.plan)}
    del trainer, model
    teardown()
    return result


def teardown() -> None:
    """As dlrm.train.run does: free the trainer's cycles (in-flight Gloo work), then the groups."""
    gc.collect()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def hierarchical_vs_flat(nodes: int, ranks_per_node: int) -> float:
    """Max |hierarchical - flat| over a few rank-dependent tensors (sizes not divisible by g too)."""
    from dlrm.core.dense_sync import hierarchical_allreduce_
    from dlrm.core.topology import build_process_groups

    torch.distributed.init_process_group("gloo")
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    rank = torch.distributed.get_rank()
    worst = 0.0
    for n in (1, 7, 1000, 4099):
        t = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + n))
        flat = t.clone()
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        worst = max(worst, (hierarchical_allreduce_(t, groups) - flat).abs().max().item())
    torch.distributed.destroy_process_group()
    return worst


def process_group_layout(nodes: int, ranks_per_node: int) -> dict:
    """The global ranks in this rank's intra-node and inter-node groups."""
    from dlrm.core.topology import build_process_groups

    torch.distributed.init_process_group("gloo")
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    layout = {
        "intra_node": torch.distributed.get_process_group_ranks(groups.intra_node),
        "inter_node": torch.distributed.get_process_group_ranks(groups.inter_node),
    }
    torch.distributed.destroy_process_group()
    return layout


def train_summary(cfg: Config) -> dict:
    """Train (or evaluate, with trainer.eval_only) on this rank and return the run summary."""
    from dlrm.core.trainer import Trainer

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    summary = Trainer(cfg, world).train()
    teardown()
    return summary


class _NaNInjector:
    """A batch source whose global batch `index` has a NaN dense feature in rank `rank`'s slice."""

    def __init__(self, source, index: int, rank: int) -> None:
        self.source, self.index, self.rank = source, index, rank

    def num_batches(self, split):
        return self.source.num_batches(split)

    def batches(self, split, rank, world_size, start_step=0):
        for step, batch in enumerate(self.source.batches(split, rank, world_size, start_step), start_step):
            if split == "train" and step == self.index and rank == self.rank:
                batch.dense_features[0, 0] = float("nan")
            yield batch


def train_with_a_nan_batch(cfg: Config, index: int, rank: int) -> dict:
    """train_and_report, with a NaN injected into one rank's slice of global batch `index`."""
    from dlrm.core.trainer import Trainer

    validate(cfg)
    world = World.from_env()
    trainer = Trainer(cfg, world)
    trainer.source = _NaNInjector(trainer.source, index, rank)
    trainer.train()
    pieces = {
        name: [(offsets, t.detach().clone()) for t, offsets, _ in local_pieces(value)]
        for name, value in trainer.model.state_dict().items()
    }
    result = {"losses": trainer.losses, "pieces": pieces, "skipped": trainer.skipped_steps}
    del trainer
    teardown()
    return result


def train_in_turn(*cfgs: Config) -> list:
    """Train each config in turn in this job (e.g. uninterrupted, then resumed); each one's logged losses."""
    from dlrm.core.trainer import Trainer

    world = World.from_env()
    losses = []
    for cfg in cfgs:
        validate(cfg)
        validate_world(cfg, world.world_size, world.local_world_size)
        trainer = Trainer(cfg, world)
        trainer.train()
        losses.append(trainer.losses)
        del trainer
        gc.collect()
    teardown()
    return losses


def resume_error(cfg: Config) -> str:
    """Build a trainer that resumes (cfg.trainer.resume) and return the CheckpointError it raises."""
    from dlrm.core.checkpoint import CheckpointError
    from dlrm.core.trainer import Trainer

    validate(cfg)
    try:
        Trainer(cfg, World.from_env())
    except CheckpointError as e:
        torch.distributed.destroy_process_group()
        return str(e)
    raise AssertionError("the checkpoint was loaded")
