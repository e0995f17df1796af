"""Read ahead: run an iterator in a background thread, a bounded number of items ahead of its consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

_DONE = object()


def read_ahead(items: Iterator, depth: int) -> Iterator:
    """Run `items` in a background thread, `depth` ahead; errors are re-raised in the consumer."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(x) -> bool:
        while not stop.is_set():
            try:
                q.put(x, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def work():
        try:
            for x in items:
                if not put(x):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer
            put(e)

    thread = threading.Thread(target=work, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            x = q.get()
            if x is _DONE:
                return
            if isinstance(x, BaseException):
                raise x
            yield x
    finally:
        stop.set()
