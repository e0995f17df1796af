"""dlrm.io: an atomic write replaces the whole file or nothing, and leaves no temporary file."""

import hashlib
import json

import pytest

from dlrm.io import atomic_path, sha256_file, write_atomic, write_json_atomic


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    write_atomic(path, b"old")
    write_json_atomic(path, {"b": 1, "a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2], "b": 1}
    assert path.read_text().endswith("\n")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"good")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("disk full")
    assert path.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
    with pytest.raises(TypeError):  # not JSON: nothing written, the old file stays
        write_json_atomic(path, {"x": object()})
    assert path.read_bytes() == b"good"


def test_sha256_file_reads_in_blocks(tmp_path):
    data = bytes(range(256)) * 1000
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f", block=1000) == hashlib.sha256(data).hexdigest()
