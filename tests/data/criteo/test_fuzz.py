"""Fuzz the loader's readers: seeded byte flips, truncations, insertions and appends of the three .npy
files of a day and of manifest.json. Every case must end within a time bound in either a
CriteoDataError (never another exception, never a numpy traceback), or, where the damage leaves the
data meaning the same, a loader serving exactly the original data.

With checksums on, every altered .npy byte must be refused. With them off, what is accepted must
still be valid: labels 0/1, ids inside their tables, finite dense values.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest

from dlrm.config import CriteoConfig
from dlrm.data.criteo.loader import CriteoDataError, CriteoSource
from tests.helpers.criteo import SAMPLE
from tests.helpers.criteo_data import GBS, NAMES, ROWS, TABLE_ROWS, make_dataset

pytestmark = pytest.mark.skipif(not SAMPLE.exists(), reason=f"{SAMPLE} not found")
NPY = ["day_0_dense.npy", "day_0_sparse.npy", "day_0_labels.npy", "day_1_labels.npy"]
SECONDS_PER_CASE = 10  # generous for 2 busy cores; a case takes milliseconds


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = make_dataset(tmp_path_factory.mktemp("fuzz") / "out")
    return d, {name: (d / name).read_bytes() for name in NPY + ["manifest.json"]}


def mutate(raw: bytes, rng: np.random.Generator, header_bytes: int) -> bytes:
    """One random alteration of `raw` (never a no-op)."""
    kind = rng.choice(
        ["flip", "flips", "header", "truncate", "insert", "append"], p=[0.35, 0.15, 0.2, 0.15, 0.075, 0.075]
    )
    b = bytearray(raw)
    if kind in ("flip", "flips", "header"):
        hi = min(header_bytes, len(b)) if kind == "header" else len(b)
        for pos in rng.integers(0, hi, 1 if kind != "flips" else rng.integers(2, 6)):
            b[pos] ^= int(rng.integers(1, 256))
    elif kind == "truncate":
        del b[int(rng.integers(0, len(b))) :]
    elif kind == "insert":
        pos = int(rng.integers(0, len(b)))
        b[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
    else:
        b += rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
    return bytes(b)


def put(path: Path, raw: bytes) -> None:
    """Write as a new file (new inode): arrays still mapped from the old one never see it shrink."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(raw)
    tmp.replace(path)


def open_source(directory: Path, checksums: bool) -> CriteoSource:
    cfg = CriteoConfig(dir=str(directory), train_days=[0, 1], verify_checksums=checksums, shuffle=False)
    return CriteoSource(cfg, NAMES, list(TABLE_ROWS), GBS, seed=0)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def run_cases(directory: Path, originals: dict, seed: int, cases: int, checksums: bool) -> dict:
    """Returns counts {refused, accepted} and checks every accepted case; restores the files after each."""
    rng = np.random.default_rng(seed)
    ref = open_source(directory, checksums=True)
    ref_arrays = {d: {k: np.array(v) for k, v in a.items()} for d, a in ref.arrays.items()}
    counts = {"refused": 0, "accepted": 0}
    names = list(originals)
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for case in range(cases):
            name = names[case % len(names)]
            raw = mutate(originals[name], rng, 256 if name.endswith(".npy") else len(originals[name]))
            assert raw != originals[name]
            put(directory / name, raw)
            t = time.monotonic()
            signal.alarm(SECONDS_PER_CASE)
            try:
                src = open_source(directory, checksums)
            except CriteoDataError as e:
                counts["refused"] += 1
                assert "\n" not in str(e) and str(directory) in str(e), (case, name, str(e))
                src = None
            except _Timeout:
                pytest.fail(f"case {case} ({name}, seed {seed}) ran past {SECONDS_PER_CASE}s")
            finally:
                signal.alarm(0)
            assert time.monotonic() - t < SECONDS_PER_CASE
            if src is not None:
                counts["accepted"] += 1
                check_accepted(src, ref_arrays, name, checksums, case)
            del src
            put(directory / name, originals[name])
    finally:
        signal.signal(signal.SIGALRM, old)
    return counts


def check_accepted(src: CriteoSource, ref_arrays: dict, name: str, checksums: bool, case: int) -> None:
    if checksums or name == "manifest.json":
        # the checksum covers every .npy byte; an accepted manifest change must not change the data
        assert name == "manifest.json", f"case {case}: altered {name} accepted with checksums on"
        for d, arrays in ref_arrays.items():
            for k, v in arrays.items():
                assert np.array_equal(np.asarray(src.arrays[d][k]), v), (case, d, k)
        return
    for a in src.arrays.values():  # without checksums: whatever is accepted is valid data
        labels, sparse, dense = (np.asarray(a[k]) for k in ("labels", "sparse", "dense"))
        assert labels.shape[1] == 1 and sparse.shape[1] == 26 and dense.shape[1] == 13
        assert np.isin(labels, [0, 1]).all() and (sparse >= 0).all() and (sparse < ROWS).all()
        assert np.isfinite(dense).all()
    batches = src.batches("train", 0, 1)
    assert next(batches).dense_features.shape == (GBS, 13)
    batches.close()  # stops the read-ahead thread before the files change again


def test_fuzz_with_checksums_refuses_every_altered_npy(data):
    directory, originals = data
    counts = run_cases(directory, originals, seed=0, cases=300, checksums=True)
    assert counts["refused"] >= 240  # every .npy case (240 of 300) and most manifest cases
    assert counts["refused"] + counts["accepted"] == 300


def test_fuzz_without_checksums_accepts_only_valid_data(data):
    directory, originals = data
    npy_only = {k: v for k, v in originals.items() if k.endswith(".npy")}
    counts = run_cases(directory, npy_only, seed=1, cases=200, checksums=False)
    assert counts["refused"] > 0 and counts["refused"] + counts["accepted"] == 200
