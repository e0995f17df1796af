"""The training state a checkpoint holds, as torch.distributed.checkpoint's `Stateful`."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict

import torch

from dlrm.checkpoint import data_signature, model_signature, step_tensor
from dlrm.config import Config
from dlrm.data.source import PositionedSource
from dlrm.distributed.sharding import describe_plan
from dlrm.trainer.clock import RunTime


class TrainState:
    """The model's and the optimizers' live tensors and the step (`state_dict` / `load_state_dict`,
    the `Stateful` protocol), and the manifest that describes them.

    Optimizer hyper-parameters are not saved: they come from the config, the lr from the step. The
    manifest names the optimizers, so a resume with other ones is refused. DCP saves the live tensors
    and loads into them in place.
    """

    def __init__(
        self,
        cfg: Config,
        model: torch.nn.Module,
        optimizer,
        world_size: int,
        plan,
        run_config_sha256: str | None = None,
        run_time: RunTime | None = None,
        positioned: PositionedSource | None = None,
    ) -> None:
        self.cfg, self.model, self.optimizer, self.world_size, self.plan = cfg, model, optimizer, world_size, plan
        self.run_config_sha256 = run_config_sha256  # the run directory's config.yaml as recorded (rank 0)
        self.run_time = run_time  # the run's time so far, recorded in the manifest
        self.step = 0
        self.positioned = positioned  # a source whose position a checkpoint records (Parquet's), or None

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
        return {"embedding": self.cfg.optim.embedding.name, "dense": self.cfg.optim.dense.name}

    def expected(self, weights_only: bool = False) -> dict:
        """What a checkpoint must match to load into this state (the optimizers only with their state)."""
        expected = {"model": model_signature(self.cfg.model), "optim": self.optimizer_names()}
        if weights_only:
            expected.pop("optim")
        return expected

    def manifest(self) -> dict:
        return {
            "world_size": self.world_size,
            "sharding_plan": describe_plan(self.plan),
            "model": model_signature(self.cfg.model),
            "data": data_signature(self.cfg.data),  # how the model reads rows: dlrm.export records it
            "optim": self.optimizer_names(),
            "config_sha256": hashlib.sha256(json.dumps(asdict(self.cfg), sort_keys=True).encode()).hexdigest(),
            **({"run_config_sha256": self.run_config_sha256} if self.run_config_sha256 else {}),
            **({"run_time": self.run_time.record(self.step)} if self.run_time is not None else {}),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **({"data_position": self.positioned.position(self.step)} if self.positioned is not None else {}),
        }
