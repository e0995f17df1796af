"""Optimizers: a fused embedding optimizer (applied in backward), a dense one, and the LR schedule."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm.config import DenseOptimConfig, EmbeddingOptimConfig, OptimConfig, ScheduleConfig
from dlrm.distributed.local_sgd import LocalSGD


def _embedding_optimizer(cfg: EmbeddingOptimConfig):
    """(optimizer class, kwargs) TorchRec maps to fbgemm's fused kernels (EmbOptimType)."""
    return {
        "rowwise_adagrad": (RowWiseAdagrad, {"lr": cfg.lr, "eps": cfg.eps}),
        "adagrad": (torch.optim.Adagrad, {"lr": cfg.lr, "eps": cfg.eps}),
        "sgd": (torch.optim.SGD, {"lr": cfg.lr}),
        "adam": (torch.optim.Adam, {"lr": cfg.lr, "eps": cfg.eps}),
    }[cfg.name]


def _dense_optimizer(cfg: DenseOptimConfig, params) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    if cfg.name == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.eps)
    return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps)


def fuse_embedding_optimizer(model: torch.nn.Module, cfg: EmbeddingOptimConfig) -> None:
    """Attach the embedding optimizer to the tables' parameters, before sharding.

    Sharded tables get it fused into fbgemm's backward kernel; data-parallel tables run it in
    backward too, so every sharding type trains the tables with the same rule.
    """
    cls, kwargs = _embedding_optimizer(cfg)
    tables = [p for name, p in model.named_parameters() if "embedding_bags" in name]
    apply_optimizer_in_backward(cls, tables, kwargs)


def build_optimizer(
    model: torch.nn.Module, fused: torch.optim.Optimizer, cfg: OptimConfig, local_sgd: LocalSGD | None = None
) -> CombinedOptimizer:
    """All of a model's optimizers, stepped together.

    Data-parallel tables are replicated and allreduced like the MLPs, outside the fused kernels; they still
    get the embedding optimizer (class, lr), so every sharding trains tables alike.

    Args:
        model: the DMP-wrapped model.
        fused: DMP's `fused_optimizer` (the embedding optimizer inside the fused kernels).
        cfg: the optim section.
        local_sgd: with it, the optimizers of the replicated parameters average them periodically after
            stepping; the fused one is untouched.

    Returns:
        The fused, the data-parallel tables' and the dense optimizer as one CombinedOptimizer.
    """

    def replicated(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return local_sgd.wrap(optimizer) if local_sgd is not None else optimizer

    rest = dict(in_backward_optimizer_filter(model.named_parameters()))
    tables = {name: p for name, p in rest.items() if "embedding_bags" in name}
    dense = {name: p for name, p in rest.items() if name not in tables}
    optimizers = [fused, KeyedOptimizerWrapper(dense, lambda params: replicated(_dense_optimizer(cfg.dense, params)))]
    if tables:
        cls, kwargs = _embedding_optimizer(cfg.embedding)
        optimizers.append(KeyedOptimizerWrapper(tables, lambda params: replicated(cls(params, **kwargs))))
    return CombinedOptimizer(optimizers)


def lr_factor(step: int, cfg: ScheduleConfig) -> float:
    """MLPerf DLRM's learning-rate multiplier at `step` (0-based).

    Linear warmup from 1/warmup_steps to 1 over warmup_steps, constant until decay_start_step,
    then ((decay_end - step) / decay_steps) ** decay_power down to 0 at decay_end.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.decay_steps and step >= cfg.decay_start_step:
        remaining = max(cfg.decay_start_step + cfg.decay_steps - step, 0)
        return (remaining / cfg.decay_steps) ** cfg.decay_power
    return 1.0


def lr_schedule(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, step: int = 0, origin: int = 0) -> LambdaLR:
    """torch's LambdaLR over `lr_factor`, positioned at `step` (the next step to train).

    Every param group's lr is its initial lr times lr_factor(step - origin). Call its `step()` after each
    training step. The factor is a function of the step alone, so a resumed run is positioned by its step
    (no scheduler state is saved).

    Args:
        origin: the step the schedule's clock starts at (optim.schedule.on_new_data=restart starts it at a
            continuation's first step).
    """
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])  # LambdaLR's base lr; set at step 0, kept from then on
    return LambdaLR(optimizer, lambda s: lr_factor(s - origin, cfg), last_epoch=step - 1)
