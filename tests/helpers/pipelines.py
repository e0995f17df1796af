"""A CPU stand-in for TorchRec's PrefetchTrainPipelineSparseDist around an evaluation.

PrefetchTrainPipelineSparseDist cannot run on CPU: its embedding prefetch needs a data-distribution
CUDA stream (`prefetch_embeddings` returns without prefetching when there is none), so the first
forward finds no prefetched input and fails. What the trainer must do around it is still checkable:
its `progress`, unlike TrainPipelineSparseDist's, does not re-attach a model that an evaluation
detached, and the batches it holds (input distributed, embeddings prefetched into the UVM cache) must
not be there when an evaluation's forward runs (the cache's queued prefetch would be taken by it).
`NoAutoAttachPipeline` is TrainPipelineSparseDist with that `progress` and a record of the calls.
"""

from __future__ import annotations

from collections.abc import Iterator

from torchrec.distributed.train_pipeline import TrainPipelineSparseDist


class NoAutoAttachPipeline(TrainPipelineSparseDist):
    """TrainPipelineSparseDist whose `progress` fails on a detached model, as the prefetch pipeline's
    does; `calls` lists ("detach" | "attach" | "progress", batches held at the call)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int]] = []

    def detach(self):
        self.calls.append(("detach", len(self.batches)))
        return super().detach()

    def attach(self, model=None, sparse_dist: bool = True) -> None:
        self.calls.append(("attach", len(self.batches)))
        super().attach(model, sparse_dist)

    def progress(self, dataloader_iter: Iterator):
        self.calls.append(("progress", len(self.batches)))
        if not self._model_attached:
            raise AssertionError("progress on a detached model: PrefetchTrainPipelineSparseDist fails here")
        return super().progress(dataloader_iter)


def train_with_stand_in_pipeline(cfg) -> dict:
    """train_and_report with NoAutoAttachPipeline as the trainer's pipeline; adds its `calls`."""
    from dlrm.trainer.loop import train
    from tests.helpers.workers import build_trainer, pieces_of

    trainer = build_trainer(cfg)
    pipeline = NoAutoAttachPipeline(trainer.model, trainer.optimizer, trainer.device, custom_model_fwd=trainer.forward)
    trainer.pipeline = pipeline
    train(trainer)
    return {"losses": trainer.losses, "pieces": pieces_of(trainer.detached_model()), "calls": pipeline.calls}
