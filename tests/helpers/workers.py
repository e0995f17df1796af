"""The rank functions several distributed tests share: train on this rank and report (importable,
so spawn can pickle them). A rank function one test module needs lives in that module.

Each builds what it needs in the job's default process group and leaves the group to the harness
(tests/helpers/harness.py), so several of them share one launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dlrm.config import Config, validate, validate_world
from dlrm.distributed.sharding import describe_plan
from dlrm.distributed.world import World
from dlrm.models.dlrm import local_pieces


def build_trainer(cfg: Config):
    """A validated Trainer for this rank (the world from the launcher's environment)."""
    from dlrm.trainer.build import build

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    return build(cfg, world)


def pieces_of(model: torch.nn.Module) -> dict:
    """{param name: [((row offset, col offset), tensor copy), ...]}: this rank's pieces of the weights."""
    return {
        name: [(offsets, t.detach().clone()) for t, offsets, _ in local_pieces(value)]
        for name, value in model.state_dict().items()
    }


def train_and_report(cfg: Config) -> dict:
    """Train on this rank; the logged losses, this rank's pieces of the final weights (`pieces_of`),
    the plan (dlrm.distributed.sharding.describe_plan), the summary and which MLPs used oneDNN."""
    from dlrm.models.mlp import ReLUMLP
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    summary = train(trainer)
    return {
        "losses": trainer.losses,
        "pieces": pieces_of(trainer.detached_model()),
        "plan": describe_plan(trainer.plan),
        "summary": summary,
        "onednn": [m.onednn for m in trainer.model.modules() if isinstance(m, ReLUMLP)],
    }


def train_summary(cfg: Config) -> dict:
    """Train (or evaluate, with trainer.eval_only) on this rank and return the run summary."""
    from dlrm.trainer.loop import train

    return train(build_trainer(cfg))


def summary_and_records(cfg: Config, run_dir) -> dict:
    """Train (or evaluate) on this rank in `run_dir` (rank 0 writes there): {"summary", "records"}
    with rank 0's metrics.jsonl records ([] on other ranks)."""
    from dlrm.trainer.build import build
    from dlrm.trainer.loop import train

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    summary = train(build(cfg, world, Path(run_dir)))
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if world.is_main else []
    return {"summary": summary, "records": [json.loads(line) for line in lines]}


def train_losses(cfg: Config) -> list[float]:
    """Train on this rank; the logged losses."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    train(trainer)
    return trainer.losses
