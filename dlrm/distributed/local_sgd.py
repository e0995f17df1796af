"""Local SGD for the dense part (trainer.dense_sync=local_sgd), with torch's post-local SGD.

The first W steps (trainer.local_sgd_warmup_steps) allreduce the dense gradients as usual. After
them, DDP's hook returns each rank's own gradients (no communication), every rank steps its dense
weights alone, and the weights are averaged over all ranks after every step s (1-based) with
s >= W and s % H == 0 (H = trainer.sync_period; W is a multiple of H). The embedding tables are
untouched: the sharded ones stay synchronous through the alltoalls and their fused optimizer.

Replicated parameters are those DDP holds: the MLPs, the interaction, data-parallel tables.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:  # torch's post-local SGD is imported when a run uses it (torch.distributed.optim: 0.3 s)
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer


@functools.cache
def _optimizer_class() -> type[PostLocalSGDOptimizer]:
    """torch's PostLocalSGDOptimizer with the `step(closure=None)` signature TorchRec's
    KeyedOptimizerWrapper calls."""
    from torch.distributed.optim import PostLocalSGDOptimizer

    class NoClosurePostLocalSGDOptimizer(PostLocalSGDOptimizer):
        def step(self, closure=None) -> None:  # type: ignore[override]
            if closure is not None:
                raise ValueError("local SGD's optimizer takes no closure")
            super().step()

    return NoClosurePostLocalSGDOptimizer


class LocalSGD:
    """The hooks' states and the averagers of one run; `at(step)` sets them for a resume."""

    def __init__(self, sync_period: int, warmup_steps: int, group: dist.ProcessGroup) -> None:
        self.period, self.warmup, self.group = sync_period, warmup_steps, group
        self.states: list[PostLocalSGDState] = []
        self.averagers: list[PeriodicModelAverager] = []
        self.params: list[torch.nn.Parameter] = []

    def hook(self, model: torch.nn.Module) -> int:
        """Register the post-local SGD hook on every DDP module inside `model` (before the first
        forward): no gradient allreduce after the warm-up. Returns how many DDP modules got it."""
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState,
            post_localSGD_hook,
        )

        ddps = [m for m in model.modules() if isinstance(m, DistributedDataParallel)]
        for ddp in ddps:
            state = PostLocalSGDState(self.group, None, self.warmup, post_local_gradient_allreduce=False)
            ddp.register_comm_hook(state, post_localSGD_hook)
            self.states.append(state)
        return len(ddps)

    def wrap(self, optimizer: torch.optim.Optimizer) -> PostLocalSGDOptimizer:
        """`optimizer` (over replicated parameters) followed by the periodic average of its parameters."""
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

        # The averager counts 1-based steps (see `at`): it averages after step s >= W, (s - W) % H == 0.
        averager = PeriodicModelAverager(self.period, self.warmup, self.group)
        averager.step = 1
        self.averagers.append(averager)
        self.params += [p for group in optimizer.param_groups for p in group["params"]]
        return _optimizer_class()(optimizer, averager)

    def check_covered(self, model: torch.nn.Module) -> None:
        """Every parameter a DDP module inside `model` holds must be averaged, or it would drift."""
        averaged = {id(p) for p in self.params}
        for ddp in (m for m in model.modules() if isinstance(m, DistributedDataParallel)):
            for name, p in ddp.module.named_parameters():  # sharded tables: ignored by DDP
                if p.requires_grad and name not in ddp.parameters_to_ignore and id(p) not in averaged:
                    raise NotImplementedError(
                        f"trainer.dense_sync=local_sgd: the replicated parameter {name} has no averaged "
                        "optimizer (its update runs in backward); use trainer.dense_sync=allreduce"
                    )

    def at(self, step: int) -> None:
        """Continue from `step` steps done (a resume)."""
        for state in self.states:
            state.iter = min(step, self.warmup)
        for averager in self.averagers:
            averager.step = step + 1

    def averaged(self, step: int) -> bool:
        """Whether the replicated weights agree on every rank after `step` (1-based) steps."""
        return step <= self.warmup or (step - self.warmup) % self.period == 0

    def due(self, step: int, last: bool) -> bool:
        """Whether the run's end needs an average now: `last` and the weights differ after `step`."""
        return last and not self.averaged(step)

    def average(self) -> None:
        """Average the replicated parameters now (the end of a run between two averaging steps)."""
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        if self.params:
            average_parameters(iter(self.params), self.group)
