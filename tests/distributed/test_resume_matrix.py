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
from tests.helpers.equivalence import tiny
from tests.helpers.families import PAIR, SINGLE
from tests.helpers.workers import train_losses

OPTIMIZERS = {  # embedding optimizer -> overrides (the dense optimizer follows the optim group)
    "sgd": ("optim=sgd",),
    "adagrad": ("optim=rowwise_adagrad", "optim.embedding.name=adagrad"),
    "rowwise_adagrad": ("optim=rowwise_adagrad",),
}
PIPELINE = {"pipelined": True, "plain": False}
CASES = [(o, p) for o in sorted(OPTIMIZERS) for p in PIPELINE]


def _cfg(optimizer, pipeline, name, *overrides):
    return tiny(
        *OPTIMIZERS[optimizer],
        f"trainer.pipeline={str(PIPELINE[pipeline]).lower()}",
        "sharding=table_wise",
        "optim.schedule.warmup_steps=4",
        "trainer.max_steps=6",
        "checkpoint.every_steps=3",
        f"checkpoint.dir={_dir(optimizer, pipeline, name)}",
        *overrides,
    )


def _dir(optimizer, pipeline, name):
    return PAIR.dir(f"matrix_{optimizer}_{pipeline}_{name}")


for _o, _p in CASES:
    _resume = f"trainer.resume={_dir(_o, _p, 'whole') / 'step_00000003'}"
    PAIR.add(f"matrix/{_o}/{_p}/whole", train_losses, _cfg(_o, _p, "whole"))
    PAIR.add(f"matrix/{_o}/{_p}/same", train_losses, _cfg(_o, _p, "same", _resume))
    SINGLE.add(f"matrix/{_o}/{_p}/other", train_losses, _cfg(_o, _p, "other", _resume))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, pipeline", CASES)
def test_resumed_equals_uninterrupted(tmp_path, optimizer, pipeline):
    key = f"matrix/{optimizer}/{pipeline}"
    whole, same, other = PAIR[f"{key}/whole"][0], PAIR[f"{key}/same"][0], SINGLE[f"{key}/other"][0]
    assert len(whole) == 6 and same == whole[3:]  # bit-exact: same maths, same order
    assert other == pytest.approx(whole[3:], rel=1e-5)
    final = {
        name: export(_dir(optimizer, pipeline, name) / "step_00000006", tmp_path / f"{name}.pt")
        for name in ("whole", "same", "other")
    }
    for k, expected in final["whole"].items():
        assert torch.equal(final["same"][k], expected), k
        torch.testing.assert_close(final["other"][k], expected, rtol=1e-5, atol=2e-6, msg=k)
    at_resume = export(_dir(optimizer, pipeline, "whole") / "step_00000003", tmp_path / "at_resume.pt")
    assert all(not torch.equal(final["whole"][k], at_resume[k]) for k in at_resume if "embedding_bags" in k), (
        "the steps after the resume point left a table unchanged: nothing was tested"
    )
