"""Trainer.step_once's per-step duties, on a stand-in trainer: the lr schedule moves once per step
(a skipped step too), and the host waits for the device after a step only with trainer.sync_every_step."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from dlrm.trainer.trainer import Trainer


@pytest.mark.parametrize("sync_every_step", [False, True])
def test_step_once_syncs_only_when_asked_and_moves_the_schedule(sync_every_step):
    calls: list[str] = []
    losses = iter([None, torch.tensor(0.5), torch.tensor(0.25)])  # None: a skipped first step (on_nonfinite=skip)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))

    def train_step(batch):  # as Trainer.train_step: the optimizer steps unless the step is skipped
        calls.append("step")
        loss = next(losses)
        if loss is not None:
            opt.step()
        return loss

    stand_in = SimpleNamespace(
        settings=SimpleNamespace(trainer=SimpleNamespace(sync_every_step=sync_every_step)),
        pipeline=None,
        train_step=train_step,
        sync=lambda: calls.append("sync"),
        schedule=schedule,
    )
    batches = iter(range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the skipped step's schedule move warns nothing
        returned = [Trainer.step_once(stand_in, batches) for _ in range(3)]  # type: ignore[arg-type]
    assert [r is None for r in returned] == [True, False, False]
    assert calls == ["step", "sync"] * 3 if sync_every_step else calls == ["step"] * 3
    assert schedule.last_epoch == 3 and opt.param_groups[0]["lr"] == pytest.approx(0.25)
