"""Functions run on each rank by the distributed tests (importable, so spawn can pickle them)."""

from __future__ import annotations

import torch

from dlrm.config import Config, validate, validate_world
from dlrm.model import local_pieces
from dlrm.sharding import describe_plan
from dlrm.topology import World


def train_and_report(cfg: Config) -> dict:
    """Train on this rank; return the logged losses and this rank's pieces of the final weights.

    pieces: {param name: [((row offset, col offset), tensor), ...]}; plan: dlrm.sharding.describe_plan
    """
    from dlrm.trainer import Trainer

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
    torch.distributed.destroy_process_group()
    return {"losses": trainer.losses, "pieces": pieces, "plan": describe_plan(trainer.plan)}
