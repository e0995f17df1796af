"""The UVM cache's line locks around an evaluation (TorchRec's prefetch pipeline, fbgemm's cache).

With `sharding.prefetch_pipeline`, fbgemm's table-batched embedding (TBE) locks the cache lines a
batch's ids occupy when it loads them (`lock_cache_line`, its `lxu_cache_locking_counter`) and only
that batch's backward pass unlocks them. An evaluation's lookups run no backward: each would leave
its lines locked for the rest of the run, and the cache could evict ever fewer lines. Evaluating with
the locks off is exact: the pipeline holds no batch at an evaluation (dlrm.trainer.trainer), so no
line is locked then and none needs to be.

Two libraries' internals are used here only: fbgemm's `lock_cache_line` (read by its `_prefetch`), and
TorchRec's `_lookups`, the list in which a sharded collection keeps its lookups (and so the TBEs: they
are not submodules of the model). tests/trainer/test_cache_locks.py fails when either changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen


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
