"""dlrm.common.io: an atomic write replaces the whole file or nothing, and leaves no temporary file."""

import hashlib
import json

import pytest

from dlrm.common.io import atomic_path, sha256_file, write_atomic, write_json_atomic


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


def test_a_planted_symlink_at_a_temporary_name_is_never_written_through(tmp_path):
    """The temporary file's name is random and created new (O_EXCL): symlinks planted at the names an
    earlier version used (.NAME.tmp, .NAME.tmp<pid>) are left alone, and so is what they point to."""
    import os

    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me")
    out = tmp_path / "scores.npy"
    for name in (f".{out.name}.tmp", f".{out.name}.tmp{os.getpid()}"):
        (tmp_path / name).symlink_to(precious)
    write_atomic(out, b"new")
    assert precious.read_bytes() == b"keep me" and out.read_bytes() == b"new"
    assert out.stat().st_mode & 0o777 == 0o644  # not mkstemp's private 0600


@pytest.mark.parametrize("inside", [False, True])
def test_an_output_that_is_an_input_is_refused(tmp_path, inside):
    from dlrm.common.errors import UserError
    from dlrm.common.io import refuse_alias

    data = tmp_path / "data.tsv"
    data.write_text("x")
    out = tmp_path / "ckpt" / "manifest.json" if inside else tmp_path / "." / "data.tsv"
    inputs = {"the checkpoint": tmp_path / "ckpt"} if inside else {"--data": data}
    with pytest.raises(UserError, match="would overwrite"):
        refuse_alias(out, "--out", inputs)
    refuse_alias(tmp_path / "other.npy", "--out", inputs)  # anything else is fine
