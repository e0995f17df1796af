"""Rank functions of the local SGD tests (importable, so spawn can pickle them)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from dlrm.config import Config
from tests.helpers.workers import build_trainer


def _replicated_params(trainer) -> list[torch.nn.Parameter]:
    """The parameters DDP replicates (the dense ones; it ignores the sharded tables)."""
    ddps = [m for m in trainer.model.modules() if isinstance(m, torch.nn.parallel.DistributedDataParallel)]
    return [p for ddp in ddps for n, p in ddp.module.named_parameters() if n not in ddp.parameters_to_ignore]


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """A copy of `params`, flattened [n]."""
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def dense_after_each_step(cfg: Config) -> dict:
    """Train; the replicated weights right after each optimizer step (the pipeline's too), and at the end."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    snapshots, params, step = [], _replicated_params(trainer), trainer.optimizer.step

    def step_and_snapshot(*args, **kwargs):
        step(*args, **kwargs)
        snapshots.append(_flat(params))

    trainer.optimizer.step = step_and_snapshot  # the pipeline calls the instance's step
    train(trainer)
    return {"steps": snapshots, "final": _flat(_replicated_params(trainer)), "losses": trainer.losses}


def count_allreduces(cfg: Config) -> dict:
    """Train under torch.profiler; how many allreduces ran (c10d's dispatched op: DDP's, the
    averager's, the trainer's own), and the final replicated weights."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train(trainer)
    names = [e.name for e in prof.events() or []]
    return {
        "allreduces": sum(1 for n in names if n == "c10d::allreduce_"),
        "names": sorted({n for n in names if n.startswith("c10d::") or "gloo" in n}),
        "final": _flat(_replicated_params(trainer)),
    }
