"""The small training config of the equivalence tests, and the sharded == unsharded assertion."""

import pytest
import torch

STEPS = 8


def config(make_config, *overrides):
    """model=tiny, SGD, global batch 96, STEPS steps, a loss logged every step; then `overrides`."""
    return make_config(
        "model=tiny",
        "optim=sgd",
        "data.global_batch_size=96",
        "data.eval_batches=2",
        f"trainer.max_steps={STEPS}",
        "trainer.log_every_steps=1",
        "trainer.progress=none",
        *overrides,
    )


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
