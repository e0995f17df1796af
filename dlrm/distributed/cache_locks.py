"""The UVM cache's line locks, switched off around an evaluation (sharding.prefetch_pipeline).

With the prefetch pipeline, fbgemm locks the cache lines a batch's ids occupy and only that batch's
backward unlocks them; an evaluation runs no backward, so its lookups run with the locks off. This is
exact because the pipeline holds no batch at an evaluation. Two library internals are used here only:
fbgemm's `lock_cache_line` and TorchRec's `_lookups`.
"""

# The mechanism in full: docs/design/library-workarounds.md.
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen


# fbgemm's lock_cache_line and TorchRec's _lookups are library internals:
# tests/trainer/test_cache_locks.py fails if either changes.
def embedding_kernels(model: torch.nn.Module) -> list[SplitTableBatchedEmbeddingBagsCodegen]:
    """fbgemm's TBE modules of `model`'s sharded embedding collections, each once."""
    found: dict[int, SplitTableBatchedEmbeddingBagsCodegen] = {}
    for module in model.modules():
        for lookup in getattr(module, "_lookups", ()):
            for m in lookup.modules():
                if isinstance(m, SplitTableBatchedEmbeddingBagsCodegen):
                    found[id(m)] = m
    return list(found.values())


@contextmanager
def cache_lines_unlocked(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the model's TBEs that lock cache lines (those with a prefetch pipeline) load
    lines without locking them; as before after it."""
    locking = [m for m in embedding_kernels(model) if m.lock_cache_line]
    for m in locking:
        m.lock_cache_line = False
    try:
        yield
    finally:
        for m in locking:
            m.lock_cache_line = True
