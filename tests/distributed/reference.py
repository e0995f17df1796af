"""The unsharded single-process reference: plain PyTorch, the whole global batch, SGD everywhere."""

from __future__ import annotations

import torch

from dlrm.config import Config
from dlrm.data.loader import make_source
from dlrm.model import build_model, initialize


def train_unsharded(cfg: Config) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and final weights of the model trained on whole global batches.

    Needs optim=sgd (one lr for tables and MLPs each) and a constant schedule.
    """
    assert cfg.optim.embedding.name == cfg.optim.dense.name == "sgd"
    model = build_model(cfg.model, torch.device("cpu"))
    initialize(model, cfg.model, cfg.seed)
    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    dense = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    optimizer = torch.optim.SGD(
        [{"params": tables, "lr": cfg.optim.embedding.lr}, {"params": dense, "lr": cfg.optim.dense.lr}]
    )
    batches = make_source(cfg).batches("train", rank=0, world_size=1)
    losses = []
    for _ in range(cfg.trainer.max_steps):
        optimizer.zero_grad()
        loss, _ = model(next(batches))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
