"""The launcher's world: this process's rank and the job's shape, as torchrun sets them.

Torch-free, so that the entry points check a config against the world before importing torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dlrm.common.errors import UsageError


class LauncherError(UsageError):
    """The launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) do not describe a job: one line naming the variable and its value."""

    same_on_all_ranks = False  # the rank itself may be what is wrong: every process says it


_FIX = "launch with torchrun (python -m dlrm.torchrun), which sets them, or unset them for one process"
_HOST = re.compile(r"[A-Za-z0-9._:\[\]%-]{1,253}")  # a host name, IPv4 or (bracketed) IPv6 address


def _integer(env: dict[str, str] | os._Environ, name: str, default: int) -> int:
    text = env.get(name)
    if text is None:
        return default
    if not re.fullmatch(r"\s*\d{1,9}\s*", text):
        raise LauncherError(f"{name}={text!r} is not a non-negative integer; {_FIX}")
    return int(text)


@dataclass(frozen=True)
class World:
    """This process's place in the job, as the launcher (torchrun) describes it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ | None = None) -> World:
        """torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (`env`, default os.environ); a single
        process without them.

        Raises:
            LauncherError: they, or MASTER_ADDR / MASTER_PORT, cannot describe a job (not integers, a rank
                outside its size, a node size that does not divide the world).
        """
        env = os.environ if env is None else env
        world_size = _integer(env, "WORLD_SIZE", 1)
        rank = _integer(env, "RANK", 0)
        local_world_size = _integer(env, "LOCAL_WORLD_SIZE", world_size)
        local_rank = _integer(env, "LOCAL_RANK", 0)
        shape = f"WORLD_SIZE={world_size}, RANK={rank}, LOCAL_WORLD_SIZE={local_world_size}, LOCAL_RANK={local_rank}"
        if world_size < 1 or local_world_size < 1:
            raise LauncherError(f"WORLD_SIZE and LOCAL_WORLD_SIZE must be at least 1 ({shape}); {_FIX}")
        if rank >= world_size or local_rank >= local_world_size:
            raise LauncherError(f"a rank must be below its size ({shape}); {_FIX}")
        if world_size % local_world_size:
            raise LauncherError(
                f"LOCAL_WORLD_SIZE must divide WORLD_SIZE (every node runs as many ranks; {shape}); {_FIX}"
            )
        port = env.get("MASTER_PORT")
        if port is not None and not (re.fullmatch(r"\s*\d{1,5}\s*", port) and 1 <= int(port) <= 65535):
            raise LauncherError(f"MASTER_PORT={port!r} is not a port (an integer 1..65535); {_FIX}")
        addr = env.get("MASTER_ADDR")
        if addr is not None and not _HOST.fullmatch(addr):
            raise LauncherError(f"MASTER_ADDR={addr!r} is not a host name or address; {_FIX}")
        return cls(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size)
