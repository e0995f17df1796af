"""Batches produced in background threads, ahead of the training loop.

`Prefetcher`: any source's iterator, on one thread `depth` items ahead: the training thread then
only takes ready batches off a queue, and the source's work (synthetic generation, file reads,
parsing) overlaps the step. The order and content of the batches are the source's own. With
`pin_device` (a GPU), each batch is copied to page-locked memory in the thread, so the
host-to-device copy can run asynchronously.

`OrderedWorkers`: items made by index (`make(i)`) on several threads, handed over in index order:
worker w makes items start + w, start + w + N, ..., so the sequence (and where an error is raised
in it) is the one a single worker gives.

Threads still running at interpreter exit are stopped and joined first (`stop_producer_threads`).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

_END = object()
# The stop event and threads of every Prefetcher and OrderedWorkers whose threads were not joined yet
# (an abandoned one's too: its threads may still hold a batch), by id of the event.
_RUNNING: dict[int, tuple[threading.Event, list[threading.Thread]]] = {}


def _track(stop: threading.Event, threads: list[threading.Thread]) -> None:
    """Record a new pool's threads, and forget the pools whose threads have all ended."""
    for key in [k for k, (_, ts) in list(_RUNNING.items()) if not any(t.is_alive() for t in ts)]:
        _RUNNING.pop(key, None)
    _RUNNING[id(stop)] = (stop, threads)


@atexit.register
def stop_producer_threads(timeout: float = 5.0) -> None:
    """Stop and join every producer thread still running (each waits at most `timeout` s), while the
    interpreter is whole: a thread that dropped its batch during shutdown could not take the GIL that
    freeing a numpy-backed tensor needs, and the process would abort ('terminate called without an
    active exception')."""
    running = list(_RUNNING.values())
    for stop, _ in running:
        stop.set()
    for _, threads in running:
        for t in threads:
            t.join(timeout)
    _RUNNING.clear()


def prefetch_pays(device: torch.device, local_world_size: int) -> bool:
    """Whether a producer thread can hide the source's work: always on CUDA (the host waits on the
    GPU, and batches must be pinned); on CPU only if the ranks' compute threads leave a core free
    (else the thread only competes with the step).
    """
    import torch  # here only: preprocessing uses the Prefetcher and starts without torch (seconds)

    if device.type == "cuda":
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > local_world_size * torch.get_num_threads()


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _produce(items: Iterator, out: queue.Queue[object], stop: threading.Event, pin_device: torch.device | None) -> None:
    """The producer thread: put each item (pinned for `pin_device` if given), then _END or the exception raised."""

    def put(item: object) -> bool:  # wait for room; False once stopped
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    try:
        if pin_device is not None:  # a new thread's current device is cuda:0: pin on this rank's GPU's context
            import torch

            torch.cuda.set_device(pin_device)
        for item in items:
            if not put(item.pin_memory() if pin_device is not None else item):
                return
    except BaseException as e:  # handed to the consumer, raised there
        put(_Raised(e))
        return
    put(_END)


class Prefetcher(Iterator[T]):
    """Iterate over `items` with a producer thread that stays up to `depth` items ahead.

    An exception raised by `items` is re-raised here, at the position it happened. `close()`
    (also on garbage collection or the end of a `with` block) stops the thread.
    """

    def __init__(self, items: Iterator[T], depth: int = 2, pin_device: torch.device | None = None) -> None:
        self._stop = threading.Event()
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._done = False
        self._thread = threading.Thread(
            target=_produce,
            args=(items, self._queue, self._stop, pin_device),
            name="dlrm-prefetch",
            daemon=True,
        )
        self._thread.start()
        _track(self._stop, [self._thread])

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Raised):
            self._done = True
            raise item.error
        return cast(T, item)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the producer thread (items it has not yet handed over are dropped)."""
        self._done = True
        self._stop.set()
        self._thread.join(timeout)
        _RUNNING.pop(id(self._stop), None)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # the thread holds no reference to self: an abandoned Prefetcher stops it
        self._stop.set()


class OrderedWorkers(Iterator[T]):
    """Items make(start), make(start + 1), ... (up to `stop`, exclusive; None: endless), made on
    `workers` threads, each up to `depth` items ahead, and handed over in index order.

    `make` is called from several threads at once: it must be thread-safe. An exception raised by
    make(i) is re-raised by the i-th `next`, after the items before it, as one worker would.
    `close()` (also at the end of a `with` block or on garbage collection) stops every thread.

    Raises:
        ValueError: `workers` or `depth` below 1.
    """

    def __init__(self, make: Callable[[int], T], start: int, stop: int | None, workers: int, depth: int = 2) -> None:
        if workers < 1 or depth < 1:
            raise ValueError(f"workers and depth must be >= 1, got {workers} and {depth}")
        self._stop = threading.Event()
        self._queues: list[queue.Queue[object]] = [queue.Queue(maxsize=depth) for _ in range(workers)]
        self._start, self._next, self._end, self._done = start, start, stop, False
        self._threads = [
            threading.Thread(
                target=_produce,
                args=(_indexed(make, start + w, stop, workers), q, self._stop, None),
                name=f"dlrm-reader-{w}",
                daemon=True,
            )
            for w, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()
        _track(self._stop, self._threads)

    def __iter__(self) -> OrderedWorkers[T]:
        return self

    def __next__(self) -> T:
        if self._done or (self._end is not None and self._next >= self._end):
            self._done = True
            raise StopIteration
        item = self._queues[(self._next - self._start) % len(self._queues)].get()
        self._next += 1
        if item is _END:  # not reached: a worker's items end only at `stop`
            self._done = True
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.error
        return cast(T, item)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop every worker (items not yet handed over are dropped)."""
        self._done = True
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        _RUNNING.pop(id(self._stop), None)

    def __enter__(self) -> OrderedWorkers[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # the threads hold no reference to self: an abandoned pool stops them
        self._stop.set()


def _indexed(make: Callable[[int], T], first: int, stop: int | None, every: int) -> Iterator[T]:
    """make(first), make(first + every), ... below `stop` (None: endless)."""
    i = first
    while stop is None or i < stop:
        yield make(i)
        i += every
