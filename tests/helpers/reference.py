"""The unsharded single-process reference: plain PyTorch, the whole global batch, SGD everywhere."""

from __future__ import annotations

import torch

from dlrm.config import Config
from dlrm.data.source import make_source
from dlrm.models.dlrm import build_model, initialize


def train_unsharded(cfg: Config, skip_batches: tuple = ()) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-step losses and final weights of the model trained on whole global batches.

    Needs optim=sgd (one lr for tables and MLPs each) and a constant schedule. Global batches
    whose 0-based index is in `skip_batches` are read but not trained on.
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
    for index in range(cfg.trainer.max_steps):
        batch = next(batches)
        if index in skip_batches:
            continue
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
