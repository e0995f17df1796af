"""A small preprocessed Criteo directory (from the real sample) and ways to damage it (hostile data tests)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from tests.helpers.criteo import SAMPLE

ROWS = 2000  # every table of model=dlrm_small; the data are hashed into it
NAMES = [f"C{i + 1}" for i in range(26)]
TABLE_ROWS = [ROWS] * 26
GBS = 10


def make_dataset(out: Path) -> Path:
    """Preprocess the sample (100 rows) and its first 40 lines into days 0 and 1 of `out`."""
    from dlrm.data.criteo.format import ParseOptions
    from dlrm.data.criteo.preprocess import preprocess

    out.mkdir(parents=True, exist_ok=True)
    half = out.parent / f"{out.name}_half.tsv"
    half.write_text("\n".join(SAMPLE.read_text().split("\n")[:40]) + "\n")
    preprocess([str(SAMPLE), str(half)], str(out), ParseOptions("fail", "modulo", tuple(TABLE_ROWS)))
    return out


def snapshot(directory: Path) -> dict:
    """{name: sha256} of every file in `directory`: compare before and after to show nothing changed."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).iterdir()) if p.is_file()
    }


def copy(base: Path, dest: Path) -> Path:
    shutil.copytree(base, dest)
    return dest


def rewrite(directory: Path, day: int, kind: str, array: np.ndarray, *, fix_manifest: bool = True) -> Path:
    """Replace day_{day}_{kind}.npy by `array` (np.save); fix_manifest: as if the manifest had been written
    for it (rows, bytes, sha256), so that only the content is wrong."""
    path = Path(directory) / f"day_{day}_{kind}.npy"
    np.save(path, array)
    if fix_manifest:
        set_file_in_manifest(directory, day, kind)
    return path


def set_file_in_manifest(directory: Path, day: int, kind: str) -> None:
    """Make manifest.json agree with the file's current bytes and checksum."""
    path = Path(directory) / f"day_{day}_{kind}.npy"
    m = json.loads((Path(directory) / "manifest.json").read_text())
    meta = next(d for d in m["days"] if d["day"] == day)
    meta["files"][kind].update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    (Path(directory) / "manifest.json").write_text(json.dumps(m))


def edit_manifest(directory: Path, fn) -> None:
    path = Path(directory) / "manifest.json"
    m = json.loads(path.read_text())
    fn(m)
    path.write_text(json.dumps(m))


def load(directory: Path, day: int, kind: str) -> np.ndarray:
    return np.load(Path(directory) / f"day_{day}_{kind}.npy")
