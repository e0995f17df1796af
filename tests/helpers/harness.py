"""Run functions on local Gloo ranks with torch's elastic launcher.

`launch_jobs` runs a list of jobs (fn(*args) on every rank) in turn in ONE launch: one process group
and one set of imports for all of them. A rank function may use the default process group (the
Trainer, or `default_group()`) but never destroys it: the harness tears it down after the last job.

nnodes=N simulates N nodes on this machine: one elastic agent per "node", each in its own process,
meeting at one loopback c10d rendezvous, as N torchruns would.

Agents and ranks start from multiprocessing's fork server, which imports PRELOAD (torch, TorchRec,
the trainer) once per test process; each starts with those imports done, in a process that has run no
step, opened no process group and started no thread. The server keeps the environment of the test
process at its first launch; a rank's launcher variables come from its agent.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import pickle
import random
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.launcher.api import LaunchConfig, elastic_launch


@dataclass(frozen=True)
class Job:
    """fn(*args) on every rank. expect_error: an exception (raised alike on every rank) is the result,
    as a JobError, instead of failing the launch."""

    fn: Callable
    args: tuple = ()
    expect_error: bool = False


@dataclass(frozen=True)
class JobError:
    """What an expect_error job raised: type name and message."""

    type: str
    message: str


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (what a bind to port 0 or a connect picks from)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback TCP port that is free now and that nothing on this machine will be handed meanwhile.

    The port is chosen below the kernel's ephemeral range: a port taken from that range (bind to port
    0) and released at once can be handed by the kernel to any other process's bind-to-0 or outgoing
    connection (a concurrent job's Gloo listener or pair socket) before the launcher binds it; its
    store then fails to bind and falls back to connecting, as a client, to that stranger. Ports
    below the range are never handed out implicitly, and this session never hands out one twice.
    Use it only where several processes must know the port in advance (several agents); one agent
    binds port 0 itself (`launch_jobs`).
    """
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free loopback port below {low}")


def default_group() -> dist.ProcessGroup:
    """The job's default (Gloo) group, created by the first job that needs it."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return dist.group.WORLD  # type: ignore[return-value]


def run_in_turn(jobs: list[Job]) -> list[tuple]:
    """On one rank: every job in turn, freeing each one's objects before the next; then the teardown
    dlrm.train.run does (free cycles holding in-flight Gloo work, then the groups). Runs torch with
    one intra-op thread. Returns each job's (result, wall seconds)."""
    faulthandler.enable(file=sys.__stderr__)  # a rank that aborts prints its threads' stacks (as dlrm.train's)
    # One intra-op thread: the ranks share the cores with the test session's other processes, and
    # OpenMP threads that wait for a descheduled sibling make tiny steps several times slower. The
    # trainer keeps a count set before it (dlrm.trainer.threads).
    torch.set_num_threads(1)
    # The fork server's objects (the imports) outlive every job: frozen, the collections after each job
    # scan only what the jobs made. (A freeze before each job would also freeze a job's process groups
    # and Gloo pairs that a later job releases, and they would never be collected.)
    gc.freeze()
    results = []
    for job in jobs:
        start = time.perf_counter()
        try:
            result = job.fn(*job.args)
        except Exception as e:
            if not job.expect_error:
                raise
            result = JobError(type(e).__name__, str(e))
        gc.collect()
        results.append((result, time.perf_counter() - start))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return results


PRELOAD = [
    "torch",
    "torchrec",
    "dlrm.trainer.build",
    "dlrm.trainer.loop",
    "tests.helpers.harness",
    "tests.helpers.workers",
]


def _forkserver() -> multiprocessing.context.BaseContext:
    """multiprocessing's fork server context, its server (started on first use) importing PRELOAD."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def _config(nnodes: int, nproc: int, run_id: str, endpoint: str) -> LaunchConfig:
    return LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=endpoint,
        max_restarts=0,
        start_method="forkserver",
        monitor_interval=0.1,
    )


def _agent(config: LaunchConfig, jobs, queue) -> None:
    _forkserver()  # this agent's ranks come from a fork server of its own
    try:
        # Plain pickle copies tensors; the queue's own pickler would share them through file
        # descriptors that die with this process.
        queue.put(pickle.dumps(elastic_launch(config, run_in_turn)(jobs)))
    except BaseException as e:  # report the failure to the test instead of hanging it
        queue.put(RuntimeError(f"{type(e).__name__}: {e}"))  # launcher errors do not pickle


def launch_jobs(jobs: list[Job], nproc: int, nnodes: int = 1, timeout: float = 600) -> list[list[tuple]]:
    """Every job on nnodes x nproc ranks in one launch; [job][rank] (result, seconds) (the result a
    JobError for a job that raised with expect_error)."""
    # One agent hosts the rendezvous store on a port the kernel picks (bound, never released, as
    # torchrun --standalone does); several agents must know it in advance.
    port = 0 if nnodes == 1 else free_port()
    config = _config(nnodes, nproc, str(uuid.uuid4()), f"127.0.0.1:{port}")
    ctx = _forkserver()
    if nnodes == 1:
        results = elastic_launch(config, run_in_turn)(jobs)
    else:
        queue = ctx.Queue()
        agents = [ctx.Process(target=_agent, args=(config, jobs, queue)) for _ in range(nnodes)]
        for agent in agents:
            agent.start()
        results = {}
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
    ranks = nnodes * nproc
    return [[results[r][j] for r in range(ranks)] for j in range(len(jobs))]
