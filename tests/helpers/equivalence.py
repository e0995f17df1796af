"""The small training config of the equivalence tests, its cached unsharded reference, and the
sharded == unsharded assertion."""

import functools

import pytest
import torch

from dlrm.config.compose import compose
from tests.helpers.families import Overrides
from tests.helpers.reference import train_unsharded

STEPS = 8
BASE = (
    "model=tiny",
    "optim=sgd",
    "data.global_batch_size=96",
    "data.eval_batches=2",
    f"trainer.max_steps={STEPS}",
    "trainer.log_every_steps=1",
    "trainer.progress=none",
)


def tiny(*overrides: str) -> Overrides:
    """model=tiny, SGD, global batch 96, STEPS steps, a loss logged every step; then `overrides`."""
    return Overrides(*BASE, *overrides)


def config(*overrides: str):
    """The Config of `tiny(*overrides)`."""
    return compose(list(tiny(*overrides)))


@functools.cache
def reference(overrides: Overrides, skip_batches: tuple = ()) -> tuple[list[float], dict[str, torch.Tensor]]:
    """train_unsharded of these overrides, once per session (callers must not modify the result)."""
    return train_unsharded(compose(list(overrides)), skip_batches)


def assert_matches_reference(results, ref_losses, ref_weights):
    """Every rank's losses equal the reference's, and every shard equals its block of the reference
    weights, within fp32 tolerance."""
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), f"rank {rank} losses"
        assert set(result["pieces"]) == set(ref_weights)
        for name, pieces in result["pieces"].items():
            full = ref_weights[name]
            for (r0, c0), piece in pieces:
                expected = full[r0 : r0 + piece.shape[0], c0 : c0 + piece.shape[1]] if full.dim() == 2 else full
                torch.testing.assert_close(piece, expected, rtol=1e-5, atol=2e-6, msg=f"{name} on rank {rank}")


def matches(results, overrides: Overrides) -> None:
    """assert_matches_reference against the cached reference of `overrides`."""
    assert_matches_reference(results, *reference(overrides))
