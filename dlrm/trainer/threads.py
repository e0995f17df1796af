"""Intra-op threads per rank: chosen from the cores this process may use and the ranks on the node.

torch starts one OpenMP thread per usable core in every process, so ranks sharing a node oversubscribe
it unless a launcher set OMP_NUM_THREADS. `intra_op_threads` picks cores // local ranks (at least 1);
`apply_intra_op_threads` applies it unless the user chose: the config key trainer.intra_op_threads,
OMP_NUM_THREADS / MKL_NUM_THREADS in the environment, or an earlier `torch.set_num_threads` call
(torch's count differs from one per usable core).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch

log = logging.getLogger(__name__)
USER_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def intra_op_threads(cores: int, local_ranks: int) -> int:
    """Threads for one of `local_ranks` ranks sharing `cores` cores: an equal share, at least 1."""
    return max(1, cores // max(1, local_ranks))


def choose_intra_op_threads(
    configured: int | None, env: Mapping[str, str], current: int, cores: int, local_ranks: int
) -> tuple[int | None, str]:
    """(threads to set, None to leave torch's; the reason, for the log).

    Args:
        configured: trainer.intra_op_threads (None: automatic).
        env: the process environment.
        current: torch's intra-op thread count now.
        cores: the usable cores (`usable_cores`).
        local_ranks: the ranks on this node (LOCAL_WORLD_SIZE).
    """
    if configured is not None:
        return configured, f"trainer.intra_op_threads={configured}"
    for name in USER_VARIABLES:
        if env.get(name):
            return None, f"{name}={env[name]} (the environment's)"
    if current != cores:  # torch's default is one per usable core: someone called torch.set_num_threads
        return None, "torch.set_num_threads before the trainer"
    threads = intra_op_threads(cores, local_ranks)
    return (
        threads,
        f"{cores} cores / {local_ranks} ranks on this node; trainer.intra_op_threads or OMP_NUM_THREADS overrides",
    )


def apply_intra_op_threads(configured: int | None, local_ranks: int, env: Mapping[str, str] = os.environ) -> int:
    """Set torch's intra-op threads as `choose_intra_op_threads` says; log one line. Returns the count in use."""
    threads, why = choose_intra_op_threads(configured, env, torch.get_num_threads(), usable_cores(), local_ranks)
    if threads is not None:
        torch.set_num_threads(threads)
    log.info(f"intra-op threads per rank: {torch.get_num_threads()} ({why})")
    return torch.get_num_threads()
