"""Two simulated nodes x 2 Gloo ranks on loopback, started the way a cluster would: launch/run_multinode.sh
once per node (NODE_RANK 0 and 1), meeting at a c10d rendezvous on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid

import pytest

from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.harness import free_port

TIMEOUT_S = 120


@pytest.mark.slow
def test_two_nodes_on_loopback_through_run_multinode(tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(
        NNODES="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        NPROC_PER_NODE="2",
        RDZV_ID=f"test-{uuid.uuid4().hex[:8]}",
        DLRM_ACCEL="cpu",
        FABRIC_ENV="gloo_cpu",
        DRY_RUN="0",
    )
    for var in ("RDZV_ENDPOINT", "RUN_DIR", "NODE_RANK", "TORCHRUN", "NGPU"):
        env.pop(var, None)
    overrides = [
        "topology=cpu_2x2",
        "trainer.max_steps=5",
        "model=tiny",
        "data.global_batch_size=64",
        "trainer.progress=lines",
        f"hydra.run.dir={run_dir}",
    ]
    nodes, logs = [], []
    for rank in (0, 1):
        log = open(tmp_path / f"node{rank}.log", "w")
        logs.append(log)
        nodes.append(
            subprocess.Popen(
                ["bash", str(ROOT / "launch/run_multinode.sh"), *overrides],
                cwd=tmp_path,
                env={**env, "NODE_RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        codes = [node.wait(timeout=TIMEOUT_S) for node in nodes]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for node in nodes:  # each node's torchrun and its ranks are in their own session
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
        for log in logs:
            log.close()
    texts = [(tmp_path / f"node{r}.log").read_text() for r in (0, 1)]
    output = "\n".join(f"--- node {r} ---\n{text[:1500]}\n...\n{text[-3000:]}" for r, text in enumerate(texts))
    assert codes is not None, f"no result within {TIMEOUT_S} s\n{output}"
    assert codes == [0, 0], output
    for text in texts:  # each launcher echoed its torchrun command
        assert any(line.startswith("+ ") and "--rdzv_backend=c10d" in line for line in text.splitlines()), output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["steps"] == 5 and summary["topology"] == "cpu_2x2"
