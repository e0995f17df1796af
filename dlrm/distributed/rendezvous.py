"""Meeting the other ranks at the launcher's MASTER_ADDR:MASTER_PORT before the process group forms.

A rank that waits says so (who it waits for, where, until when) after `NOTICE_S`, and gives up in one
line at the timeout: a hand-set WORLD_SIZE whose other ranks never start, a wrong MASTER_ADDR or a
rank 0 that died would otherwise wait in silence. A rank started by torchrun also dies with its
launcher (`end_with_launcher`)."""

from __future__ import annotations

import ctypes
import itertools
import os
import platform
import signal
import socket
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from dlrm.common.errors import UserError
from dlrm.distributed.world import World

NOTICE_S = 5.0  # a rendezvous under torchrun takes well under this: past it, say who is missing
_POLL_S = 0.2
_DEFAULT_TIMEOUT_S = 1800.0  # torch's default collective timeout
_PR_SET_PDEATHSIG = 1  # prctl option, from linux/prctl.h
_STORES = itertools.count()  # launcher stores opened by this process: each gets keys of its own


def end_with_launcher() -> bool:
    """Have the kernel SIGKILL this rank when its torchrun agent dies.

    torchrun starts each rank in a session of its own, so a killed agent would otherwise leave its ranks
    training on. Linux only, and only under torchrun (TORCHELASTIC_RUN_ID). A rank whose agent is already
    gone ends here.

    Returns:
        Whether the death signal was set.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or platform.system() != "Linux":
        return False
    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:  # the agent died before the call: nobody will signal
        os.kill(os.getpid(), signal.SIGKILL)
    return True


class RendezvousTimeout(UserError):
    """Some ranks never came to the rendezvous within the timeout."""


def _say(world: World, text: str) -> None:
    print(f"rank {world.rank} of {world.world_size}: {text}", file=sys.stderr, flush=True)


def _listening(host: str, port: int) -> bool:
    """Whether something accepts connections at host:port (probed with a plain socket: a TCPStore
    client that finds nobody logs a C++ stack trace at every retry)."""
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        return True
    except OSError:
        return False


def _connect(world: World, is_master: bool, address: str, deadline: float, timeout_s: float) -> dist.TCPStore:
    """The TCPStore at `address`: hosted here (`is_master`), or reached once it listens, until `deadline`."""
    host, port = address.rsplit(":", 1)
    noticed = False
    while not is_master and not _listening(host, int(port)):
        if time.monotonic() >= deadline:
            raise RendezvousTimeout(
                f"nobody answered at {address} (MASTER_ADDR:MASTER_PORT) within {timeout_s:g} s "
                "(trainer.collective_timeout_s): start rank 0 with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE"
            )
        if not noticed:
            _say(world, f"waiting for rank 0's store at {address}; giving up after {timeout_s:g} s")
            noticed = True
        time.sleep(_POLL_S)
    try:
        return dist.TCPStore(host, int(port), world.world_size, is_master, wait_for_workers=False)
    except (RuntimeError, OSError) as e:  # DistNetworkError: the port is taken, the address not this host's
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        role = "host" if is_master else "reach"
        raise UserError(
            f"cannot {role} the rendezvous store at {address} (MASTER_ADDR:MASTER_PORT): {why}; "
            "pick a free MASTER_PORT and an address of this host"
        ) from None


JOINED = "joined"  # a counter: the ranks that have joined
ALL_JOINED = "all_joined"  # set by the last rank to join


def _joined_count(store: dist.Store) -> int:
    return store.add(JOINED, 0)


def _missing(store: dist.Store, world: World) -> list[int]:
    """The ranks whose `joined/RANK` key is not there: one request per rank (rank 0, for its messages only)."""
    return [r for r in range(world.world_size) if not store.check([f"joined/{r}"])]


def _who(store: dist.Store, world: World) -> str:
    """Who is missing: named on rank 0 (a check per rank), counted on the others (one request)."""
    if world.rank == 0:
        missing = _missing(store, world)
        listed = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        return f"rank(s) {listed}"
    return f"{world.world_size - _joined_count(store)} rank(s) (rank 0 names them)"


def _join(store: dist.Store, world: World, address: str, deadline: float, timeout_s: float) -> None:
    """Count this rank in (`JOINED`) and poll `ALL_JOINED`, which the last rank to join sets.

    One request per rank per poll whatever the world size; `joined/RANK` names the ranks for rank 0's
    messages. One join per store prefix.
    """
    store.set(f"joined/{world.rank}", os.uname().nodename)
    if store.add(JOINED, 1) == world.world_size:
        store.set(ALL_JOINED, "1")
    started, noticed = time.monotonic(), False
    while not store.check([ALL_JOINED]):
        now = time.monotonic()
        if now >= deadline:
            raise RendezvousTimeout(
                f"{_who(store, world)} of WORLD_SIZE={world.world_size} never joined at {address} within "
                f"{timeout_s:g} s (trainer.collective_timeout_s): start every rank with the same MASTER_ADDR, "
                "MASTER_PORT and WORLD_SIZE, or launch with torchrun"
            )
        if not noticed and now - started >= NOTICE_S:
            _say(world, f"waiting for {_who(store, world)} to join at {address}; giving up after {timeout_s:g} s")
            noticed = True
        time.sleep(_POLL_S)


def launcher_store(world: World, timeout_s: float | None = None) -> dist.Store:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT once every rank has joined.

    The store's prefix is new for every attempt: it carries the restart count where torchrun's agent hosts
    the store (it outlives restarts), and is constant where rank 0 hosts a new store every round. It also
    counts the stores this process opened before: a process that makes its group again (runs in one
    test process) reads none of its earlier group's addresses.

    Args:
        world: this process's place in the job.
        timeout_s: how long the store's operations wait (None: torch's default).

    Raises:
        RendezvousTimeout: some ranks did not join in time.
    """
    timeout_s = _DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    store = _connect(world, world.rank == 0 and not agent_hosts_it, address, deadline, timeout_s)
    store.set_timeout(timedelta(seconds=timeout_s))
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"dlrm/attempt_{count}" if agent_hosts_it else "dlrm/job"
    prefixed = dist.PrefixStore(f"{prefix}/{next(_STORES)}", store)
    _join(prefixed, world, address, deadline, timeout_s)
    return prefixed
