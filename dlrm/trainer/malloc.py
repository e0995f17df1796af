"""The host allocator of a training process: glibc's malloc set to keep the memory a step frees.

Every step allocates and frees the same large host tensors (activations, their gradients, the pooled
embeddings). Fixing glibc's mmap threshold at its maximum (larger blocks, the tables, are still mapped
on their own) and raising its trim threshold keeps those blocks in the heap for the next step, instead
of unmapping them and page-faulting them in again. Peak RSS is unchanged.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 1 << 30

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # glibc's own variables


def user_set_malloc() -> bool:
    """Whether the environment already tunes glibc's malloc (its MALLOC_* or GLIBC_TUNABLES variables)."""
    return any(v in os.environ for v in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory() -> bool:
    """Set this process's malloc to keep freed blocks (`MMAP_THRESHOLD`, `TRIM_THRESHOLD`).

    Returns:
        Whether it did: False off glibc (another C library, or macOS) and when the environment already
        tunes malloc (a user's settings win).
    """
    if platform.libc_ver()[0] != "glibc" or user_set_malloc():
        return False
    libc = ctypes.CDLL(None)  # the C library this process runs on
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
