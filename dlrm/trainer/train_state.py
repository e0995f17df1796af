"""The training state a checkpoint holds, as torch.distributed.checkpoint's `Stateful`."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dlrm.checkpoint import data_signature, model_signature, step_tensor
from dlrm.config import DataConfig, ModelConfig, OptimConfig
from dlrm.data.source import PositionedSource
from dlrm.distributed.sharding import describe_plan
from dlrm.trainer.clock import RunTime


@dataclass(frozen=True)
class RecordedConfig:
    """What a checkpoint's manifest records of the config, and a resume compares with its own."""

    model: ModelConfig
    """The model section (its signature: the tables and layers a checkpoint's tensors fit)."""
    data: DataConfig
    """The data section (its signature: how the model reads rows)."""
    optim: OptimConfig
    """The optimizers (their names: a resume with other ones is refused)."""
    sha256: str
    """The whole config's `Config.sha256()`."""


class TrainState:
    """The model's and the optimizers' live tensors and the step (`state_dict` / `load_state_dict`,
    the `Stateful` protocol), and the manifest that describes them.

    Optimizer hyper-parameters are not saved: they come from the config, the lr from the step. The
    manifest names the optimizers, so a resume with other ones is refused. DCP saves the live tensors
    and loads into them in place.

    Args:
        config: the config's values the manifest records.
        model, optimizer: the sharded model and its combined optimizer, whose live tensors are the state.
        world_size, plan: the ranks and the sharding plan the manifest describes.
        run_config_sha256: the run directory's recorded config.yaml hash (rank 0), or None.
        run_time: the run's time so far, recorded in the manifest; None: not recorded.
        positioned: a source whose position a checkpoint records (Parquet's), or None.
    """

    def __init__(
        self,
        config: RecordedConfig,
        model: torch.nn.Module,
        optimizer,
        world_size: int,
        plan,
        run_config_sha256: str | None = None,
        run_time: RunTime | None = None,
        positioned: PositionedSource | None = None,
    ) -> None:
        self.config, self.model, self.optimizer, self.world_size, self.plan = config, model, optimizer, world_size, plan
        self.run_config_sha256, self.run_time, self.positioned = run_config_sha256, run_time, positioned
        self.step = 0

    def state_dict(self, weights_only: bool = False) -> dict:
        """{"model", "progress": {"step"}, "optim"}: optim left out with `weights_only` or when no
        optimizer has state (stateless SGD: DCP would save no key for it, then fail to find one on load)."""
        state = {"model": self.model.state_dict(), "progress": {"step": step_tensor(self.step)}}
        optim = {name: s for name, s in self.optimizer.state_dict()["state"].items() if s}
        if optim and not weights_only:
            state["optim"] = {"state": optim}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Take the step from a state loaded in place (the tensors are already the model's)."""
        self.step = int(state["progress"]["step"].item())

    def optimizer_names(self) -> dict:
        """{"embedding", "dense"}: the optimizers' names, as the manifest records them."""
        return {"embedding": self.config.optim.embedding.name, "dense": self.config.optim.dense.name}

    def expected(self, weights_only: bool = False) -> dict:
        """What a checkpoint must match to load into this state (the optimizers only with their state)."""
        expected = {"model": model_signature(self.config.model), "optim": self.optimizer_names()}
        if weights_only:
            expected.pop("optim")
        return expected

    def manifest(self) -> dict:
        """The checkpoint's manifest: sizes, plan, signatures, optimizers, config hashes, run time, data position."""
        return {
            "world_size": self.world_size,
            "sharding_plan": describe_plan(self.plan),
            "model": model_signature(self.config.model),
            "data": data_signature(self.config.data),  # how the model reads rows: dlrm.export records it
            "optim": self.optimizer_names(),
            "config_sha256": self.config.sha256,
            **({"run_config_sha256": self.run_config_sha256} if self.run_config_sha256 else {}),
            **({"run_time": self.run_time.record(self.step)} if self.run_time is not None else {}),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **({"data_position": self.positioned.position(self.step)} if self.positioned is not None else {}),
        }
