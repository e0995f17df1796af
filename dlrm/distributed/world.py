"""The launcher's world: this process's rank and the job's shape, as torchrun sets them.

Torch-free, so that the entry points check a config against the world before importing torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


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
    def from_env(cls) -> World:
        """torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; a single process without them."""
        env = os.environ
        world_size = int(env.get("WORLD_SIZE", 1))
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=world_size,
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)),
        )
