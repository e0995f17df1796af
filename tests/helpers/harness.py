"""Run a function on local Gloo ranks with torch's elastic launcher (spawned processes).

`launch(fn, nproc, *args, nnodes=N)` simulates N nodes on this machine: one elastic agent per
"node", each in its own process, meeting at one loopback c10d rendezvous, as N torchruns would.
"""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import uuid

from torch.distributed.launcher.api import LaunchConfig, elastic_launch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(nnodes: int, nproc: int, run_id: str, endpoint: str) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        max_restarts=0,
        start_method="spawn",
        monitor_interval=0.1,
    )


def _agent(config: LaunchConfig, fn, args, queue) -> None:
    try:
        # Plain pickle copies tensors; the queue's own pickler would share them through file
        # descriptors that die with this process.
        queue.put(pickle.dumps(elastic_launch(config, fn)(*args)))
    except BaseException as e:  # report the failure to the test instead of hanging it
        queue.put(RuntimeError(f"{type(e).__name__}: {e}"))  # launcher errors do not pickle


def launch(fn, nproc: int, *args, nnodes: int = 1, timeout: float = 300) -> list:
    """fn(*args) on nnodes x nproc ranks; returns every rank's return value, in rank order."""
    config = _config(nnodes, nproc, str(uuid.uuid4()), f"127.0.0.1:{free_port()}")
    if nnodes == 1:
        results = elastic_launch(config, fn)(*args)
        return [results[r] for r in range(nproc)]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    agents = [ctx.Process(target=_agent, args=(config, fn, args, queue)) for _ in range(nnodes)]
    for agent in agents:
        agent.start()
    results: dict = {}
    try:
        for _ in agents:
            part = queue.get(timeout=timeout)
            if isinstance(part, BaseException):
                raise part
            results.update(pickle.loads(part))
    finally:
        for agent in agents:
            agent.join(timeout=30)
            if agent.is_alive():
                agent.kill()
    return [results[r] for r in range(nnodes * nproc)]
