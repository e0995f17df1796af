"""Resume matrix: every embedding optimizer x the same and another world size x pipelined or not.

A run saved at step 3 and resumed to step 6 ends with the weights of the uninterrupted run: bit
for bit on the same 2 ranks, within fp32 tolerance on 1 rank (other reduction order). The weights
after the resumed steps depend on the restored optimizer state (Adagrad's sums), so a state that
did not load fails the test. Adam is not in the matrix: fbgemm has no CPU kernel for it
("Optimizer adam is not supported in CPU mode").
"""

import pytest
import torch

from dlrm.export import export
from tests.helpers.equivalence import config
from tests.helpers.harness import launch
from tests.helpers.workers import train_in_turn

OPTIMIZERS = {  # embedding optimizer -> overrides (the dense optimizer follows the optim group)
    "sgd": ("optim=sgd",),
    "adagrad": ("optim=rowwise_adagrad", "optim.embedding.name=adagrad"),
    "rowwise_adagrad": ("optim=rowwise_adagrad",),
}


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "plain"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_resumed_equals_uninterrupted(make_config, tmp_path, optimizer, pipeline):
    def cfg(name, *overrides):
        return config(
            make_config,
            *OPTIMIZERS[optimizer],
            f"trainer.pipeline={str(pipeline).lower()}",
            "sharding=table_wise",
            "optim.schedule.warmup_steps=4",
            "trainer.max_steps=6",
            "checkpoint.every_steps=3",
            f"checkpoint.dir={tmp_path / name}",
            *overrides,
        )

    resume = f"trainer.resume={tmp_path / 'whole' / 'step_00000003'}"
    whole, same = launch(train_in_turn, 2, cfg("whole"), cfg("same", resume))[0]
    (other,) = launch(train_in_turn, 1, cfg("other", resume))[0]
    assert len(whole) == 6 and same == whole[3:]  # bit-exact: same maths, same order
    assert other == pytest.approx(whole[3:], rel=1e-5)
    final = {
        name: export(tmp_path / name / "step_00000006", tmp_path / f"{name}.pt") for name in ("whole", "same", "other")
    }
    for key, expected in final["whole"].items():
        assert torch.equal(final["same"][key], expected), key
        torch.testing.assert_close(final["other"][key], expected, rtol=1e-5, atol=2e-6, msg=key)
    at_resume = export(tmp_path / "whole" / "step_00000003", tmp_path / "at_resume.pt")
    assert all(not torch.equal(final["whole"][k], at_resume[k]) for k in at_resume if "embedding_bags" in k), (
        "the steps after the resume point left a table unchanged: nothing was tested"
    )
