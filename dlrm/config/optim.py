"""The optim section: the embedding and dense optimizers and the learning-rate schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrm.config.checks import _fail, _require_positive
from dlrm.config.choices import DenseOptimizer, EmbeddingOptimizer, OnNewData


@dataclass
class EmbeddingOptimConfig:
    """Optimizer fused into the embedding backward pass (fbgemm)."""

    name: EmbeddingOptimizer = EmbeddingOptimizer.rowwise_adagrad
    """rowwise_adagrad, adagrad, sgd or adam (adam runs on CPU for data-parallel tables only); the
    data-parallel tables get the same rule, outside the fused kernels."""
    lr: float = 0.05
    """Base learning rate, scaled by optim.schedule."""
    eps: float = 1e-8
    """The adaptive optimizers' epsilon (sgd ignores it)."""


@dataclass
class DenseOptimConfig:
    """Optimizer of the dense part (MLPs, interaction)."""

    name: DenseOptimizer = DenseOptimizer.adagrad
    """sgd, adagrad or adam."""
    lr: float = 0.05
    """Base learning rate, scaled by optim.schedule."""
    eps: float = 1e-8
    """The adaptive optimizers' epsilon (sgd ignores it)."""


@dataclass
class ScheduleConfig:
    """MLPerf DLRM schedule: linear warmup, constant, then polynomial decay to 0. Steps with
    warmup_steps=0 and decay_steps=0 keep the learning rate constant."""

    warmup_steps: int = 10
    """Steps of linear warm-up: step s (0-based) trains at (s + 1) / warmup_steps of the base lr."""
    decay_start_step: int = 0
    """The first step of the decay (not before warm-up ends)."""
    decay_steps: int = 0
    """Steps of the decay, from decay_start_step to lr 0 (0: no decay)."""
    decay_power: float = 2.0
    """The decay's exponent: the factor is ((decay_start_step + decay_steps - step) / decay_steps) ** decay_power."""
    on_new_data: OnNewData = OnNewData("continue")
    """What the schedule does on a continuation over new data (a Parquet window that gained rows,
    dlrm.data.parquet.position): continue (its clock is the step: a decayed lr stays decayed) or
    restart (its clock restarts at the continuation's first step: warm-up and decay again over the new
    rows). A resume over the same data keeps the clock it had either way."""

    def check(self, key: str) -> None:
        for name in ("warmup_steps", "decay_start_step", "decay_steps"):
            if getattr(self, name) < 0:
                _fail(f"{key}.{name}", getattr(self, name), "use 0 or a positive step count")
        if self.decay_steps and self.decay_start_step < self.warmup_steps:
            _fail(f"{key}.decay_start_step", self.decay_start_step, "decay must start after warmup ends")


@dataclass
class OptimConfig:
    """The optimizers of the embedding tables and of the dense part, and their shared schedule."""

    embedding: EmbeddingOptimConfig = field(default_factory=EmbeddingOptimConfig)
    """The embedding tables' optimizer."""
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    """The dense part's optimizer."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule applied to both."""

    def check(self, key: str = "optim") -> None:
        for part in ("embedding", "dense"):
            _require_positive(f"{key}.{part}.lr", getattr(self, part).lr)
            _require_positive(f"{key}.{part}.eps", getattr(self, part).eps)
        self.schedule.check(f"{key}.schedule")
