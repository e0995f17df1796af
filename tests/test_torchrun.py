"""dlrm.torchrun's choice of store: a multi-node launch has its ranks host the job's store
(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), so a node's agent started again can join a restarted job;
single-node launches, and a multi-node dlrm.train that names no run directory (its ranks agree on one
through the agent's store), keep torch's shared store."""

from __future__ import annotations

import pytest
from torch.distributed.run import parse_args

from dlrm.torchrun import separate_store

C10D = ["--rdzv_backend=c10d", "--rdzv_endpoint=node0:29500", "--rdzv_id=job"]


@pytest.mark.parametrize(
    "argv, separate",
    [
        (["--nproc_per_node=2", "-m", "dlrm.train", "hydra.run.dir=/r"], False),
        (["--standalone", "--nnodes=2", "--nproc_per_node=2", "-m", "dlrm.train", "run.name=r"], False),
        (["--nnodes=1", *C10D, "-m", "dlrm.comms.preflight"], False),
        (["--nnodes=2", *C10D, "-m", "dlrm.train", "model=tiny", "hydra.run.dir=/shared/r"], True),
        (["--nnodes=1:4", *C10D, "-m", "dlrm.train", "run.name=exp1"], True),
        (["--nnodes=2", *C10D, "-m", "dlrm.train", "model=tiny"], False),
        (["--nnodes=2", *C10D, "-m", "dlrm.comms.preflight", "--topology", "cpu_2x2"], True),
        (["--nnodes=two", *C10D, "-m", "dlrm.train", "run.name=r"], False),  # torchrun's run reports it
    ],
)
def test_multi_node_launches_have_the_ranks_host_their_store(argv, separate):
    assert separate_store(parse_args(argv)) is separate
