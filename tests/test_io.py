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


def test_publish_dir_renames_a_whole_directory_over_an_empty_one(tmp_path):
    from dlrm.common.io import publish_dir

    stage, out = tmp_path / ".out.tmp", tmp_path / "out"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "a.bin").write_bytes(b"a")
    out.mkdir()
    publish_dir(stage, out)
    assert (out / "sub" / "a.bin").read_bytes() == b"a" and not stage.exists()
    other = tmp_path / ".other"
    other.mkdir()
    (other / "b").write_bytes(b"b")
    with pytest.raises(OSError):  # never over a directory that holds something
        publish_dir(other, out)
    assert (out / "sub" / "a.bin").exists() and (other / "b").exists()


def test_only_common_io_renames_files_into_place():
    """Every writer publishes through dlrm.common.io (fsync, one rename, the directory flushed): no
    other module calls os.replace, os.rename, Path.rename/replace or shutil.move."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "dlrm"
    renames = {("os", "replace"), ("os", "rename"), ("shutil", "move")}
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "common" / "io.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else None
            path_rename = node.func.attr in ("rename", "replace") and len(node.args) == 1 and not node.keywords
            if (name, node.func.attr) in renames or (path_rename and name not in ("str", "s", "text")):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, found
