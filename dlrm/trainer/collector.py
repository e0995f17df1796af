"""Python's cyclic garbage collector during a run: the objects made before it (the imports) frozen."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collections_skip_older_objects() -> Iterator[None]:
    """Within the block the garbage collector scans only objects made in it: the older ones (the
    imports, some 350,000 objects) are frozen, so a full collection takes milliseconds instead of
    0.2 s. A caller that froze objects itself keeps its own policy."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
