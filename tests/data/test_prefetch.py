"""The prefetch thread: the same batches as the source, errors re-raised in place, a clean stop, no
thread left running into the interpreter's shutdown."""

import subprocess
import sys
import threading
import time

import pytest
import torch

from dlrm.data.prefetch import Prefetcher, prefetch_pays
from dlrm.data.source import make_source
from tests.helpers import REPO_ROOT


def _same_batch(a, b) -> bool:
    ka, kb = a.sparse_features, b.sparse_features
    return (
        torch.equal(a.dense_features, b.dense_features)
        and torch.equal(a.labels, b.labels)
        and ka.keys() == kb.keys()
        and torch.equal(ka.values(), kb.values())
        and torch.equal(ka.lengths(), kb.lengths())
    )


@pytest.mark.parametrize("depth", [1, 3])
def test_prefetched_batches_equal_the_source(make_config, depth):
    cfg = make_config("model=tiny", "data.global_batch_size=16")
    source = make_source(cfg)
    direct = list(zip(range(7), source.batches("train", 1, 2, start_step=3)))
    prefetched = list(zip(range(7), Prefetcher(source.batches("train", 1, 2, start_step=3), depth=depth)))
    assert len(direct) == len(prefetched) == 7
    assert all(_same_batch(a, b) for (_, a), (_, b) in zip(direct, prefetched))
    eval_batches = list(Prefetcher(source.batches("eval", 0, 1)))
    assert len(eval_batches) == cfg.data.eval_batches  # a finite source ends the iteration
    assert all(_same_batch(a, b) for a, b in zip(eval_batches, source.batches("eval", 0, 1)))


def test_source_error_is_raised_after_the_good_items():
    def items():
        yield 1
        yield 2
        raise ValueError("corrupt batch 3")

    it = Prefetcher(items())
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(ValueError, match="corrupt batch 3"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_close_stops_an_endless_producer():
    produced = []

    def endless():
        while True:
            produced.append(1)
            yield len(produced)

    before = threading.active_count()
    with Prefetcher(endless(), depth=2) as it:
        assert next(it) == 1
    time.sleep(0.3)
    assert threading.active_count() == before  # the thread has ended
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count  # and produces nothing more
    with pytest.raises(ValueError):
        Prefetcher(iter([]), depth=0)


# Abandoned pools in a reference cycle (freed only by the collector, at shutdown), each thread holding a
# tensor made from numpy; an exit hook registered before dlrm's runs after it and lists the live threads.
ABANDONED = """
import atexit, sys, threading
import numpy as np
import torch
atexit.register(lambda: print(sorted(t.name for t in threading.enumerate() if t.name.startswith("dlrm-"))))
from dlrm.data.prefetch import OrderedWorkers, Prefetcher

def make(i):
    return torch.from_numpy(np.full(100, i, dtype=np.float32))

pools = [OrderedWorkers(make, 0, None, workers=2, depth=1), Prefetcher(map(make, range(10**9)), depth=1)]
for pool in pools:
    next(pool)
cycle = {"pools": pools}
cycle["self"] = cycle
del pools, pool, cycle
"""


def test_no_producer_thread_runs_into_the_interpreters_shutdown():
    """A producer thread that drops its batch while the interpreter finalizes cannot take the GIL the
    tensor's numpy deleter needs, and the process aborts after a finished run: the threads are joined
    at exit first."""
    r = subprocess.run([sys.executable, "-c", ABANDONED], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-3000:]


def test_prefetch_pays_on_cuda_or_with_a_spare_core(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert prefetch_pays(torch.device("cuda", 0), local_world_size=2)
    assert not prefetch_pays(torch.device("cpu"), local_world_size=2)  # 2 ranks x 1 thread on 2 cores
    assert prefetch_pays(torch.device("cpu"), local_world_size=1)  # one core left for the thread


def test_the_pinning_thread_works_on_the_ranks_gpu(monkeypatch):
    """A new thread's current CUDA device is cuda:0: with pin_device, the producer thread sets the
    rank's GPU before it pins anything, so 8 ranks do not all pin (and make contexts) on GPU 0."""
    events = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("set_device", d, threading.get_ident())))

    class Item:
        def __init__(self, n):
            self.n = n

        def pin_memory(self):
            events.append(("pin", self.n, threading.get_ident()))
            return self

    device = torch.device("cuda", 3)
    got = [item.n for item in Prefetcher(iter([Item(0), Item(1)]), depth=2, pin_device=device)]
    assert got == [0, 1]
    assert [e[:2] for e in events] == [("set_device", device), ("pin", 0), ("pin", 1)]
    assert len({e[2] for e in events}) == 1 and events[0][2] != threading.get_ident()  # all in the producer
    events.clear()
    assert [item.n for item in Prefetcher(iter([Item(5)]), depth=1)] == [5] and events == []  # no device: no pin
