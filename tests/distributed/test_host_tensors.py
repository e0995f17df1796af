"""No collective of ours gets a host-made tensor: the CPU stand-in for NCCL's "No backend type
associated with device type cpu" (tests/helpers/nccl_guard.py), over 2 Gloo ranks that train with
every component that calls a collective: the log's loss and stop flag, the per-phase breakdown,
evaluation, checkpoints, the summary, the non-finite check and the hierarchical dense allreduce."""

import pytest

from tests.helpers.families import PAIR, TWO_NODES, Overrides
from tests.helpers.workers import train_under_host_tensor_guard

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
PIPELINED = PAIR.add(
    "host_tensors/pipelined",
    train_under_host_tensor_guard,
    Overrides(*COMMON, f"checkpoint.dir={PAIR.dir('host_tensors_pipelined')}"),
)
PLAIN = PAIR.add(
    "host_tensors/plain",
    train_under_host_tensor_guard,
    Overrides(
        *COMMON,
        f"checkpoint.dir={PAIR.dir('host_tensors_plain')}",
        "trainer.pipeline=false",
        "trainer.on_nonfinite=skip",
    ),
)
HIERARCHICAL = TWO_NODES.add(
    "host_tensors/hierarchical",
    train_under_host_tensor_guard,
    Overrides(
        *COMMON,
        f"checkpoint.dir={TWO_NODES.dir('host_tensors')}",
        "topology=cpu_2x2",
        "trainer.dense_allreduce=hierarchical",
    ),
)
JOBS = {"pipelined": PIPELINED, "plain": PLAIN, "hierarchical": HIERARCHICAL}


@pytest.mark.slow
@pytest.mark.parametrize("job", sorted(JOBS))
def test_no_collective_of_ours_gets_a_host_tensor(job):
    for rank, result in enumerate(JOBS[job].results()):
        assert result["steps"] == 8
        assert result["violations"] == [], f"rank {rank}: host tensors NCCL would refuse: {result['violations']}"
        assert result["checked"] >= 8, result  # the guard saw our collectives (log, breakdown, eval, ...)
