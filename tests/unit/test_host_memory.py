"""The training process's malloc settings: freed step-sized blocks are reused without page faults."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from dlrm.core import host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# Allocates and frees three 3 MiB tensors per cycle, as a step does with its activations, and
# prints whether the settings were applied and the page faults of each cycle after a warm-up.
CYCLES = textwrap.dedent(
    """
    import resource, sys, torch
    from dlrm.core.host_memory import keep_freed_memory
    kept = keep_freed_memory()
    faults = []
    for cycle in range(16):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [torch.ones(3 << 18) for _ in range(3)]
        del blocks
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(kept, sum(faults[8:]))
    """
)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's: other C libraries keep their own defaults")
def test_freed_blocks_are_reused_without_page_faults():
    # glibc's defaults fault most of the 9 MiB in again every cycle (~1,500 faults); kept, the heap holds them.
    # 64 faults of slack for the interpreter's own allocations.
    out = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) < 64, f"{out[1]} page faults in 8 cycles of reused blocks"


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    ],
)
def test_a_users_malloc_settings_win(monkeypatch, env):
    for key in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert host_memory.user_set_malloc()
    assert host_memory.keep_freed_memory() is False


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert host_memory.keep_freed_memory() is False


def test_unrelated_tunables_do_not_count_as_malloc_settings(monkeypatch):
    for key in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
    assert not host_memory.user_set_malloc()
