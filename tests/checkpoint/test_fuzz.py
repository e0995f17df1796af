"""Fuzz the checkpoint reader in-process: seeded random byte flips, truncations, insertions and
zeroed ranges of `.metadata`, the `.distcp` shards and `manifest.json` of a real 2-rank checkpoint.

- damaged files: every case is refused with CheckpointError (never loads), within a time bound;
- damaged `.metadata` with the manifest re-signed (an attacker controls every byte): the reader
  refuses with CheckpointError or loads, never raises anything else, never hangs. (That no code
  runs from crafted metadata is shown by the payloads in test_ckpt_files.py.)
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from dlrm.checkpoint import METADATA, CheckpointError, load_checkpoint, step_tensor
from dlrm.export import model_config_of
from dlrm.models.dlrm import build_model
from tests.helpers.checkpoints import NEW, resign, saved_checkpoints

__all__ = ["saved_checkpoints"]  # fixture

SECONDS_PER_CASE = 10  # a generous bound on a loaded 2-core machine; cases take milliseconds


@contextmanager
def deadline(seconds: int):
    """Raise TimeoutError if the block runs longer than `seconds` (a hang fails the test)."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """A random, different version of `data`: flipped bytes, a truncation, an insertion or zeros."""
    while True:
        kind = rng.choice(["flip", "flip", "truncate", "insert", "zero"])
        out = bytearray(data)
        if kind == "flip":
            for _ in range(rng.choice([1, 1, 2, 8])):
                out[rng.randrange(len(out))] ^= rng.randrange(1, 256)
        elif kind == "truncate":
            del out[rng.randrange(len(out)) :]
        elif kind == "insert":
            at = rng.randrange(len(out) + 1)
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        else:
            at = rng.randrange(len(out))
            n = min(rng.randrange(1, 64), len(out) - at)
            out[at : at + n] = bytes(n)
        if bytes(out) != data:
            return bytes(out)


@pytest.fixture(scope="module")
def fuzz_target(saved_checkpoints, tmp_path_factory):
    """(a working copy of the newest checkpoint, its pristine files, a state to load into)."""
    work = Path(shutil.copytree(saved_checkpoints / NEW, tmp_path_factory.mktemp("fuzz") / NEW))
    pristine = {p.name: p.read_bytes() for p in work.iterdir()}
    state = {
        "model": build_model(model_config_of(work), torch.device("cpu")).state_dict(),
        "progress": {"step": step_tensor(-1)},
    }
    load_checkpoint(work, state)  # the intact checkpoint loads
    assert state["progress"]["step"].item() == 4
    return work, pristine, state


def restore(work: Path, pristine: dict) -> None:
    for p in work.iterdir():
        if p.name not in pristine:
            p.unlink()
    for name, data in pristine.items():
        (work / name).write_bytes(data)


def test_damaged_files_are_always_refused(fuzz_target):
    work, pristine, state = fuzz_target
    names = sorted(pristine)  # .metadata, __0_0.distcp, __1_0.distcp, manifest.json
    refused, slowest = 0, 0.0
    for seed in range(300):
        rng = random.Random(seed)
        name = names[seed % len(names)]
        (work / name).write_bytes(mutate(pristine[name], rng))
        started = time.perf_counter()
        with deadline(SECONDS_PER_CASE):
            with pytest.raises(CheckpointError) as refusal:
                load_checkpoint(work, state, verify=True)
        slowest = max(slowest, time.perf_counter() - started)
        assert str(work) in str(refusal.value), (seed, name, refusal.value)
        refused += 1
        restore(work, pristine)
    assert refused == 300 and slowest < SECONDS_PER_CASE


def test_resigned_damaged_metadata_is_refused_or_harmless(fuzz_target):
    """The manifest re-signed after each mutation: only the unpickler and DCP's planner stand guard."""
    work, pristine, state = fuzz_target
    outcomes = {"refused": 0, "loaded": 0}
    for seed in range(200):
        rng = random.Random(10_000 + seed)
        (work / METADATA).write_bytes(mutate(pristine[METADATA], rng))
        resign(work)
        with deadline(SECONDS_PER_CASE):
            try:
                load_checkpoint(work, state, verify=True)
                outcomes["loaded"] += 1  # a byte that does not matter (e.g. inside a save id)
            except CheckpointError as e:
                assert str(work) in str(e), (seed, e)
                outcomes["refused"] += 1
        restore(work, pristine)
    assert outcomes["refused"] > 150, outcomes  # most mutations break the metadata, and are caught
