"""No collective of ours gets a host-made tensor: the CPU stand-in for NCCL's "No backend type
associated with device type cpu" (tests/helpers/nccl_guard.py), over 2 Gloo ranks that train with
every component that calls a collective: the log's loss and stop flag, the per-phase breakdown,
evaluation, checkpoints, the summary, the non-finite check and the hierarchical dense allreduce."""

import pytest

from dlrm.config import Config
from tests.helpers.families import PAIR, TWO_NODES, Overrides, runs
from tests.helpers.nccl_guard import HostTensorGuard
from tests.helpers.workers import train_summary

COMMON = (
    "model=tiny",
    "data.global_batch_size=32",
    "data.eval_batches=2",
    "trainer.max_steps=8",
    "trainer.log_every_steps=2",
    "trainer.eval_every_steps=4",
    "trainer.breakdown=true",
    "trainer.breakdown_every=1",
    "trainer.progress=none",
    "checkpoint.every_steps=4",
)


def train_under_host_tensor_guard(cfg: Config) -> dict:
    """On each rank: train_summary inside a HostTensorGuard (tests/helpers/nccl_guard.py): the collectives of ours
    that a GPU run would fail on (a host-made tensor), and how many collectives of ours were checked."""
    with HostTensorGuard() as guard:
        summary = train_summary(cfg)
    return {"violations": guard.violations, "checked": guard.checked, "steps": summary["steps"]}


def guarded_run(job):
    """The run `job` (pipelined, plain or hierarchical) under the guard, with a checkpoint directory of its own."""
    if job == "hierarchical":
        hierarchical = ("topology=cpu_2x2", "trainer.dense_allreduce=hierarchical")
        overrides = Overrides(*COMMON, f"checkpoint.dir={TWO_NODES.dir('host_tensors')}", *hierarchical)
        return TWO_NODES.job(train_under_host_tensor_guard, overrides)
    plain = ("trainer.pipeline=false", "trainer.on_nonfinite=skip") if job == "plain" else ()
    overrides = Overrides(*COMMON, f"checkpoint.dir={PAIR.dir(f'host_tensors_{job}')}", *plain)
    return PAIR.job(train_under_host_tensor_guard, overrides)


@pytest.mark.slow
@pytest.mark.parametrize("job", ["hierarchical", "pipelined", "plain"])
@runs(results=guarded_run)
def test_no_collective_of_ours_gets_a_host_tensor(job, results):
    for rank, result in enumerate(results):
        assert result["steps"] == 8
        assert result["violations"] == [], f"rank {rank}: host tensors NCCL would refuse: {result['violations']}"
        assert result["checked"] >= 8, result  # the guard saw our collectives (log, breakdown, eval, ...)
