"""An evaluation leaves no UVM cache line locked (dlrm.distributed.cache_locks).

With `sharding.prefetch_pipeline`, fbgemm's table-batched embedding (TBE) locks the cache lines of a
batch's ids when it loads them (`lock_cache_line`, `lxu_cache_locking_counter`) and that batch's
backward unlocks them; an evaluation has no backward. The cache and its locks run on CUDA only (fbgemm
has no CPU kernel for `lru_cache_populate` or `lxu_cache_locking_counter_decrement`), so here a stand-in
cache does what they do: every lookup while `lock_cache_line` is set locks its batch's lines, the
module's backward pre-hook unlocks the oldest locked batch's, as fbgemm's
`_update_cache_counter_and_locations` does. A 1-rank CPU trainer with mid-run evaluations then runs
the real Trainer.evaluate around it.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen as TBE

from dlrm.distributed.cache_locks import cache_lines_unlocked, embedding_kernels
from tests.helpers.equivalence import config
from tests.helpers.workers import build_trainer

SLOTS = 32  # the stand-in cache's lines: ids map to id % SLOTS


class StandInCache:
    """The locks of one TBE: `locked[s]` counts the batches holding line s; `held` the lines of each
    batch locked and not yet unlocked, oldest first; `unlocked_lookups` the lookups made with locking off."""

    def __init__(self, tbe: TBE) -> None:
        self.locked = torch.zeros(SLOTS, dtype=torch.int32)
        self.held: list[torch.Tensor] = []
        self.locked_lookups = self.unlocked_lookups = 0
        tbe.prefetch_pipeline = tbe.lock_cache_line = True  # as fbgemm sets both with prefetch_pipeline
        tbe.register_full_backward_pre_hook(self.unlock_oldest)

    def lookup(self, tbe: TBE, indices: torch.Tensor) -> None:
        if not tbe.lock_cache_line:
            self.unlocked_lookups += 1
            return
        lines = torch.unique(indices.long() % SLOTS)
        self.locked[lines] += 1
        self.held.append(lines)
        self.locked_lookups += 1

    def unlock_oldest(self, module, grad_output) -> None:
        self.locked[self.held.pop(0)] -= 1


@pytest.fixture
def stand_in_caches(monkeypatch):
    """install(model): a StandInCache on each of the model's TBEs (fbgemm's `_prefetch`, which a lookup
    calls when no batch was prefetched, then also runs the stand-in's); returns {tbe: cache}. The
    process group is removed after the test."""
    caches: dict[TBE, StandInCache] = {}
    prefetch = TBE._prefetch

    def prefetch_and_lock(self, indices, offsets, *args, **kwargs):
        prefetch(self, indices, offsets, *args, **kwargs)
        caches[self].lookup(self, indices)

    def install(model: torch.nn.Module) -> dict[TBE, StandInCache]:
        caches.update({m: StandInCache(m) for m in embedding_kernels(model)})
        monkeypatch.setattr(TBE, "_prefetch", prefetch_and_lock)
        return caches

    yield install
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("pipeline", [True, False])
def test_mid_run_evaluations_leave_no_cache_line_locked(stand_in_caches, pipeline):
    """8 steps with evaluations after steps 3 and 6 and at the end: every line the training locked is
    unlocked by its backward, and the evaluations' lookups lock none (before the fix, each left its
    batches' lines locked for the rest of the run)."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(config("trainer.eval_every_steps=3", "data.eval_batches=2", f"trainer.pipeline={pipeline}"))
    caches = stand_in_caches(trainer.model)
    assert caches, "no fbgemm TBE found: has TorchRec moved its lookups (ShardedEmbeddingBagCollection._lookups)?"
    train(trainer)
    for cache in caches.values():
        assert not cache.held and int(cache.locked.abs().sum()) == 0, f"lines left locked: {cache.locked.tolist()}"
        assert cache.locked_lookups == 8 and cache.unlocked_lookups == 3 * 2  # 8 steps, 3 evaluations of 2 batches


def cpu_tbe(prefetch_pipeline: bool) -> TBE:
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    return TBE([(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)], prefetch_pipeline=prefetch_pipeline)


def test_the_locks_are_back_on_after_an_evaluation_that_fails(monkeypatch):
    locking, plain = cpu_tbe(True), cpu_tbe(False)
    collection = torch.nn.Module()
    collection._lookups = [torch.nn.ModuleList([locking, plain])]  # as TorchRec keeps them: not submodules
    model = torch.nn.Sequential(collection)
    assert embedding_kernels(model) == [locking, plain]
    with pytest.raises(RuntimeError), cache_lines_unlocked(model):
        assert locking.lock_cache_line is False and plain.lock_cache_line is False
        raise RuntimeError("the evaluation failed")
    assert locking.lock_cache_line is True and plain.lock_cache_line is False


def test_fbgemm_still_locks_lines_by_lock_cache_line():
    """The internals cache_lines_unlocked relies on: fbgemm sets `lock_cache_line` from prefetch_pipeline
    and its `_prefetch` passes it to the cache's populate. A failure here: read fbgemm's TBE again."""
    assert cpu_tbe(True).lock_cache_line is True and cpu_tbe(False).lock_cache_line is False
    assert "self.lock_cache_line," in inspect.getsource(TBE._prefetch)
    assert "lxu_cache_locking_counter_decrement" in inspect.getsource(TBE._update_cache_counter_and_locations)
