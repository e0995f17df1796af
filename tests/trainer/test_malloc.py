"""The training process's malloc settings: freed step-sized blocks are reused without page faults."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from dlrm.trainer import malloc as host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# Allocates (malloc, every page touched) and frees four 24 MiB blocks per cycle, as a step does with its
# activations, after SETUP (what applies the settings, and sets `kept`); prints `kept` and the page faults
# of the cycles after a warm-up. With glibc's defaults they are faulted in again every cycle whatever the
# process did before: each block is below the largest mmap threshold (32 MiB) but the 96 MiB freed at the
# top of the heap exceed the largest trim threshold (2 x 32 MiB), so they are mapped anew or trimmed.
CYCLES = textwrap.dedent(
    """
    import ctypes, resource
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    SETUP
    faults = []
    for cycle in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(24 << 20) for _ in range(4)]
        for block in blocks:
            ctypes.memset(block, 1, 24 << 20)
        for block in reversed(blocks):
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(kept, sum(faults[4:]))
    """
)
KEEP = "from dlrm.trainer.malloc import keep_freed_memory; kept = keep_freed_memory()"
# A 1-rank trainer (in-process group): it applies the settings itself.
TRAINER = (
    "from dlrm.config.compose import compose; from dlrm.distributed.world import World; "
    "from dlrm.trainer.build import build; "
    "build(compose(['model=tiny', 'data.global_batch_size=8']), World()); kept = True"
)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's: other C libraries keep their own defaults")
@pytest.mark.parametrize("setup", [KEEP, TRAINER], ids=["keep_freed_memory", "trainer"])
def test_freed_blocks_are_reused_without_page_faults(setup):
    # glibc's defaults: ~24,000 faults a cycle (96 MiB); kept, the heap holds the blocks. 64 faults of
    # slack for the interpreter's own allocations.
    code = CYCLES.replace("SETUP", setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-2] == "True"
    assert int(out[-1]) < 64, f"{out[-1]} page faults in 8 cycles of reused blocks"


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
