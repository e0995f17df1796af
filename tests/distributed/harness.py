"""Run a function on N local Gloo ranks with torch's elastic launcher (spawned processes)."""

from __future__ import annotations

import socket
import uuid

from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(fn, nproc: int, *args) -> list:
    """fn(*args) on `nproc` ranks of one node; returns each rank's return value, in rank order."""
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
    )
    results = elastic_launch(config, fn)(*args)
    return [results[r] for r in range(nproc)]
