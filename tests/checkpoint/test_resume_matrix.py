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
from tests.helpers.families import PAIR, SINGLE, TWO_NODES, runs
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


def _resume(optimizer, pipeline):
    return f"trainer.resume={_dir(optimizer, pipeline, 'whole') / 'step_00000003'}"


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, pipeline", CASES)
@runs(
    whole=lambda optimizer, pipeline: PAIR.job(train_losses, _cfg(optimizer, pipeline, "whole")),
    same=lambda optimizer, pipeline: PAIR.job(
        train_losses, _cfg(optimizer, pipeline, "same", _resume(optimizer, pipeline))
    ),
    other=lambda optimizer, pipeline: SINGLE.job(  # 1 rank: another plan
        train_losses, _cfg(optimizer, pipeline, "other", _resume(optimizer, pipeline))
    ),
)
def test_resumed_equals_uninterrupted(tmp_path, optimizer, pipeline, whole, same, other):
    whole, same, other = whole[0], same[0], other[0]  # rank 0's losses
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


# --- plan changes at a resume: tables move between fused kernels and data_parallel -----------------
# The saved optimizer state (row-wise Adagrad's or Adagrad's sums) must carry over to the new plan:
# the final weights then equal the uninterrupted run's (fused vs torch optimizer arithmetic: 1e-4,
# as for test_equivalence's data-parallel tables), and differ from a run whose state did not load.

STATEFUL = ("rowwise_adagrad", "adagrad")
SOURCES = ("table_wise", "data_parallel", "column_wise")
PLAN_CHANGES = [  # (saved with, resumed family, resumed sharding)
    ("table_wise", PAIR, "data_parallel"),
    ("data_parallel", PAIR, "table_wise"),
    ("data_parallel", PAIR, "row_wise"),
    ("column_wise", PAIR, "data_parallel"),
    ("table_wise", SINGLE, "data_parallel"),  # and another world size
    ("data_parallel", TWO_NODES, "table_row_wise"),  # and another node count
]


def _moved(optimizer, name, *overrides):
    return tiny(
        *OPTIMIZERS[optimizer],
        "optim.schedule.warmup_steps=4",
        "trainer.max_steps=6",
        "checkpoint.every_steps=3",
        f"checkpoint.dir={PAIR.dir(f'moved_{optimizer}_{name}')}",
        *overrides,
    )


def saved_with(optimizer, source):
    return PAIR.job(train_losses, _moved(optimizer, source, f"sharding={source}"))


def resumed_with(optimizer, source, family, target):
    saved = f"trainer.resume={PAIR.dir(f'moved_{optimizer}_{source}') / 'step_00000003'}"
    topology = "topology=cpu_2x2" if family is TWO_NODES else "topology=cpu"
    name = f"{source}_to_{family.name}_{target}"
    return family.job(train_losses, _moved(optimizer, name, f"sharding={target}", topology, saved))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", STATEFUL)
@pytest.mark.parametrize("source, family, target", PLAN_CHANGES, ids=[f"{s}-{f.name}-{t}" for s, f, t in PLAN_CHANGES])
@runs(whole=saved_with, resumed=resumed_with)
def test_a_resume_that_moves_tables_keeps_the_optimizer_state(
    tmp_path, optimizer, source, family, target, whole, resumed
):
    assert resumed[0] == pytest.approx(whole[0][3:], rel=1e-5)
    root = PAIR.dir(f"moved_{optimizer}_{source}")
    expected = export(root / "step_00000006", tmp_path / "whole.pt")
    got = export(PAIR.dir(f"moved_{optimizer}_{source}_to_{family.name}_{target}") / "step_00000006", tmp_path / "r.pt")
    at_resume = export(root / "step_00000003", tmp_path / "at_resume.pt")
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-6, msg=k)
        if "embedding_bags" in k:
            assert not torch.equal(v, at_resume[k]), f"{k} did not change after the resume: nothing was tested"
