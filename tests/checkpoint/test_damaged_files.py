"""Hostile checkpoints: damaged or crafted files are refused by `python -m dlrm.export` (the same
verification `trainer.resume` runs) with exit 2 and one line naming the file and the fix; no code
runs, nothing is written, and the previous checkpoint stays intact."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, BytesStorageMetadata, MetadataIndex

from dlrm.checkpoint import METADATA, CheckpointError, load_checkpoint, write_manifest
from tests.helpers import REPO_ROOT
from tests.helpers.checkpoints import (
    NEW,
    OLD,
    assert_refused,
    ckpts,
    digests,
    flip,
    real_metadata,
    resign,
    run_export,
    saved_checkpoints,
    step_file,
)

__all__ = ["ckpts", "saved_checkpoints"]  # fixtures


def _truncate(file: Path, size: int) -> None:
    file.write_bytes(file.read_bytes()[:size])


def _manifest_edit(ckpt: Path, edit) -> None:
    file = ckpt / "manifest.json"
    file.write_text(edit(file.read_text()))


def _unsigned_manifest(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _manifest_with_outside_file(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][f"../{OLD}/__0_0.distcp"] = manifest["files"]["__0_0.distcp"]
    write_manifest(ckpt, manifest)


# (case, damage(ckpt), what the message must name besides the file)
DAMAGED = [
    (
        "distcp_byte_flipped",
        "__0_0.distcp",
        lambda c: flip(c / "__0_0.distcp", (c / "__0_0.distcp").stat().st_size // 2),
        "sha256",
    ),
    (
        "distcp_truncated",
        "__1_0.distcp",
        lambda c: _truncate(c / "__1_0.distcp", (c / "__1_0.distcp").stat().st_size // 2),
        "bytes",
    ),
    ("distcp_empty", "__0_0.distcp", lambda c: _truncate(c / "__0_0.distcp", 0), "has 0 bytes"),
    (
        "distcp_grown",
        "__1_0.distcp",
        lambda c: (c / "__1_0.distcp").write_bytes((c / "__1_0.distcp").read_bytes() + b"\0"),
        "bytes",
    ),
    ("distcp_missing", "__1_0.distcp", lambda c: (c / "__1_0.distcp").unlink(), "missing"),
    ("metadata_missing", METADATA, lambda c: (c / METADATA).unlink(), "missing"),
    ("metadata_byte_flipped", METADATA, lambda c: flip(c / METADATA, 100), "corrupt"),
    ("metadata_truncated", METADATA, lambda c: _truncate(c / METADATA, 10), "bytes"),
    ("metadata_of_another_step", METADATA, lambda c: shutil.copy(c.parent / OLD / METADATA, c / METADATA), ""),
    ("manifest_missing", "manifest.json", lambda c: (c / "manifest.json").unlink(), "not a complete checkpoint"),
    ("manifest_empty", "manifest.json", lambda c: _truncate(c / "manifest.json", 0), "damaged"),
    (
        "manifest_binary_garbage",
        "manifest.json",
        lambda c: (c / "manifest.json").write_bytes(os.urandom(300)),
        "damaged",
    ),
    ("manifest_truncated", "manifest.json", lambda c: _truncate(c / "manifest.json", 200), "damaged"),
    (
        "manifest_step_edited",
        "manifest.json",
        lambda c: _manifest_edit(c, lambda t: t.replace('"step": 4', '"step": 9')),
        "damaged",
    ),
    (
        "manifest_reformatted",
        "manifest.json",
        lambda c: _manifest_edit(c, lambda t: json.dumps(json.loads(t), indent=4)),
        "damaged",
    ),
    ("manifest_without_checksum", "manifest.json", _unsigned_manifest, "older version"),
    ("manifest_names_a_file_outside", "manifest.json", _manifest_with_outside_file, "damaged"),
]


@pytest.mark.parametrize("case, name, damage, says", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_checkpoint_is_refused(ckpts, tmp_path, capsys, case, name, damage, says):
    ckpt, before = ckpts / NEW, digests(ckpts / OLD)
    damage(ckpt)
    rc, err = run_export(ckpt, tmp_path / "model.pt", capsys)
    message = assert_refused(rc, err, str(ckpt / name), says, out=tmp_path / "model.pt")
    assert f"trainer.resume={ckpts / OLD}" in message  # the fix names the checkpoint that is still good
    assert digests(ckpts / OLD) == before and (ckpts / NEW).is_dir()


@pytest.mark.parametrize("where", ["missing", "a_file", "the_root"])
def test_not_a_checkpoint_is_refused(ckpts, tmp_path, capsys, where):
    path = {"missing": ckpts / "step_00000099", "a_file": ckpts / NEW / "__0_0.distcp", "the_root": ckpts}[where]
    rc, err = run_export(path, tmp_path / "model.pt", capsys)
    assert_refused(rc, err, str(path), out=tmp_path / "model.pt")


@pytest.mark.parametrize("where", ["no_such_directory", "a_directory"])
def test_bad_output_path_is_refused_before_loading(ckpts, tmp_path, capsys, where):
    out = tmp_path / "nowhere" / "model.pt" if where == "no_such_directory" else tmp_path
    rc, err = run_export(ckpts / NEW, out, capsys)
    assert_refused(rc, err, str(out))


def test_a_step_file_from_another_checkpoint_is_caught_without_verify(ckpts, tmp_path, capsys):
    """Same size, other content: --no-verify skips the sha256, the step check still refuses it."""
    name = step_file(ckpts / NEW)
    shutil.copy(ckpts / OLD / name, ckpts / NEW / name)
    rc, err = run_export(ckpts / NEW, tmp_path / "model.pt", capsys, "--no-verify")
    assert_refused(rc, err, str(ckpts / NEW), "holds step 2, its manifest says 4", out=tmp_path / "model.pt")
    rc, err = run_export(ckpts / NEW, tmp_path / "model.pt", capsys)
    assert_refused(rc, err, str(ckpts / NEW / name), "sha256")


@pytest.mark.parametrize("into", ["manifest.json", ".metadata", "."])
def test_an_export_into_its_own_checkpoint_is_refused(ckpts, capsys, into):
    before = digests(ckpts / NEW)
    rc, err = run_export(ckpts / NEW, ckpts / NEW / into, capsys)
    assert_refused(rc, err, str(ckpts / NEW), "would overwrite")
    assert digests(ckpts / NEW) == before


def test_the_intact_checkpoint_exports(ckpts, tmp_path, capsys):
    rc, err = run_export(ckpts / NEW, tmp_path / "model.pt", capsys)
    assert rc == 0, err
    assert err == ""  # a small model's steps are too short to report
    assert torch.load(tmp_path / "model.pt", weights_only=True)


def test_a_long_export_reports_its_steps_and_rates(ckpts, tmp_path, capsys, monkeypatch):
    from dlrm.data.progress import Progress, Step

    monkeypatch.setattr(Step, "LONG_MIB", 0.0)  # every step counts as long
    monkeypatch.setattr(Progress, "__init__", functools.partialmethod(Progress.__init__, every=0.0))
    rc, err = run_export(ckpts / NEW, tmp_path / "model.pt", capsys)
    assert rc == 0, err
    for doing in ("verifying and loading", "hashing", "writing"):
        assert re.search(rf"^export: {doing} .*: done in [0-9.]+s \([0-9,]+ MiB/s\)$", err, re.M), err
    assert re.search(r"^export: hashing: 100% \([0-9]+ tensors, [0-9,]+ tensors/s, ETA 0s\)$", err, re.M), err


class _EnumByName(pickle.Pickler):
    """Pickles Enum members as Python 3.11.2 does, `getattr(cls, name)` (3.11.7 and 3.12: by value)."""

    def reducer_override(self, obj):
        return (getattr, (type(obj), obj.name)) if isinstance(obj, _MEM_FORMAT_ENCODING) else NotImplemented


def test_metadata_with_enum_members_by_name_loads(ckpts, tmp_path, capsys):
    """A checkpoint saved under Python 3.11.2 names builtins.getattr for DCP's memory-format enum: loaded."""
    buf = io.BytesIO()
    _EnumByName(buf, protocol=4).dump(real_metadata(ckpts / NEW))
    assert b"getattr" in buf.getvalue()
    _write_metadata(ckpts / NEW, buf.getvalue())
    rc, err = run_export(ckpts / NEW, tmp_path / "model.pt", capsys)
    assert rc == 0, err


# --- crafted payloads: an attacker writes every file, manifest checksums included ---------------


def _s(text: str) -> bytes:
    """pickle SHORT_BINUNICODE."""
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _dotted_system(cmd: str) -> bytes:
    """Protocol 4 STACK_GLOBAL of an allowed module + "os.system": pickle resolves it attribute by attribute."""
    return b"\x80\x04" + _s("torch.distributed.checkpoint.metadata") + _s("os.system") + b"\x93" + _s(cmd) + b"\x85R."


def _getattr_of(module: str, name: str, attr: str) -> bytes:
    """Protocol 4 `getattr(module.name, attr)`, the form an Enum member by name takes."""
    get = _s("builtins") + _s("getattr") + b"\x93"
    return b"\x80\x04" + get + _s(module) + _s(name) + b"\x93" + _s(attr) + b"\x86R."


def _eval(cmd: str) -> bytes:
    return b"\x80\x04cbuiltins\neval\n" + _s(f"__import__('os').system({cmd!r})") + b"\x85R."


def _posix_system(cmd: str) -> bytes:
    return b"\x80\x02cposix\nsystem\n" + _s(cmd) + b"\x85R."


class _Shell:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


@pytest.mark.parametrize(
    "payload, says", [(_dotted_system, "os.system"), (_eval, "builtins.eval"), (_posix_system, "posix.system")]
)
def test_code_in_metadata_does_not_run(ckpts, tmp_path, capsys, payload, says):
    control = tmp_path / "control"
    pickle.loads(payload(f"touch {control}"))  # the payload is live: plain pickle runs it
    assert control.exists()
    ckpt, marker = ckpts / NEW, tmp_path / "pwned"
    (ckpt / METADATA).write_bytes(payload(f"touch {marker}"))
    resign(ckpt)
    for flags in ((), ("--no-verify",)):
        rc, err = run_export(ckpt, tmp_path / "model.pt", capsys, *flags)
        assert_refused(rc, err, str(ckpt / METADATA), says, out=tmp_path / "model.pt")
    assert not marker.exists()


def test_pickled_object_entry_does_not_run(ckpts, tmp_path, capsys):
    """DCP loads a BytesStorageMetadata entry with torch.load(weights_only=False): refused."""
    ckpt, marker, control = ckpts / NEW, tmp_path / "pwned", tmp_path / "control"
    md = real_metadata(ckpt)
    tensor_index = next(i for i in md.storage_data if i.fqn == "progress.step")
    info = md.storage_data.pop(tensor_index)
    md.state_dict_metadata["progress.step"] = BytesStorageMetadata()
    for cmd in (f"touch {control}", f"touch {marker}"):
        evil = pickle.dumps(_Shell(cmd))
        md.storage_data[MetadataIndex("progress.step")] = dataclasses.replace(
            info, relative_path="__2_0.distcp", offset=0, length=len(evil)
        )
        (ckpt / "__2_0.distcp").write_bytes(evil)
        (ckpt / METADATA).write_bytes(pickle.dumps(md))
        resign(ckpt)
        if cmd.endswith("control"):  # DCP's own reader runs it
            with pytest.raises(CheckpointException, match="magic number"):  # raised after the payload ran
                dcp.load(
                    {"progress": {"step": torch.zeros(1, dtype=torch.int64)}}, checkpoint_id=str(ckpt), no_dist=True
                )
            assert control.exists()
    rc, err = run_export(ckpt, tmp_path / "model.pt", capsys)
    assert_refused(rc, err, str(ckpt / METADATA), "BytesStorageMetadata", out=tmp_path / "model.pt")
    assert not marker.exists()


def _rewrite_metadata(ckpt: Path, change) -> None:
    md = real_metadata(ckpt)
    change(md)
    (ckpt / METADATA).write_bytes(pickle.dumps(md))
    resign(ckpt)


def _first(md):
    return next(iter(md.storage_data))


def _write_metadata(ckpt: Path, data: bytes) -> None:
    (ckpt / METADATA).write_bytes(data)
    resign(ckpt)


CRAFTED = [
    ("memo_bomb", lambda c: _write_metadata(c, b"\x80\x04Nr\xff\xff\xff\x7f."), "memo index"),
    ("not_metadata", lambda c: _write_metadata(c, pickle.dumps({"state_dict_metadata": {}})), "not a DCP Metadata"),
    (
        "getattr_beyond_the_enum",
        lambda c: _write_metadata(c, _getattr_of("torch.distributed.checkpoint.metadata", "Metadata", "__init__")),
        "getattr(Metadata, '__init__')",
    ),
    (
        "getattr_of_an_enum_dunder",
        lambda c: _write_metadata(
            c, _getattr_of("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", "__class__")
        ),
        "is not a memory-format member",
    ),
    (
        "path_outside",
        lambda c: _rewrite_metadata(
            c,
            lambda md: md.storage_data.update(
                {_first(md): dataclasses.replace(md.storage_data[_first(md)], relative_path=f"../{OLD}/__0_0.distcp")}
            ),
        ),
        "does not list",
    ),
    (
        "data_beyond_the_file",
        lambda c: _rewrite_metadata(
            c,
            lambda md: md.storage_data.update(
                {_first(md): dataclasses.replace(md.storage_data[_first(md)], offset=10**9)}
            ),
        ),
        "lies outside",
    ),
    (
        "stream_transform",
        lambda c: _rewrite_metadata(
            c,
            lambda md: md.storage_data.update(
                {_first(md): dataclasses.replace(md.storage_data[_first(md)], transform_descriptors=["zstd"])}
            ),
        ),
        "transforms",
    ),
    (
        "metadata_is_the_manifest",
        lambda c: _rewrite_metadata(
            c,
            lambda md: md.storage_data.update(
                {_first(md): dataclasses.replace(md.storage_data[_first(md)], relative_path="manifest.json")}
            ),
        ),
        "does not list",
    ),
]


@pytest.mark.parametrize("case, craft, says", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_metadata_is_refused(ckpts, tmp_path, capsys, case, craft, says):
    ckpt, before = ckpts / NEW, digests(ckpts / OLD)
    craft(ckpt)
    rc, err = run_export(ckpt, tmp_path / "model.pt", capsys, "--no-verify")
    assert_refused(rc, err, str(ckpt / METADATA), says, out=tmp_path / "model.pt")
    assert digests(ckpts / OLD) == before


def test_refusal_happens_before_dcp_reads(ckpts):
    """load_checkpoint raises CheckpointError itself (not DCP's wrapped exceptions)."""
    flip(ckpts / NEW / "__1_0.distcp", 50)
    with pytest.raises(CheckpointError, match="__1_0.distcp is corrupt"):
        load_checkpoint(ckpts / NEW, {"progress": {"step": torch.zeros(1, dtype=torch.int64)}})


@pytest.mark.slow
def test_export_command_refuses_a_payload(ckpts, tmp_path):
    """The real entry point: `python -m dlrm.export` exits 2 with one line, and the command never runs."""
    import subprocess
    import sys

    ckpt, marker = ckpts / NEW, tmp_path / "pwned"
    (ckpt / METADATA).write_bytes(_dotted_system(f"touch {marker}"))
    resign(ckpt)
    result = subprocess.run(
        [sys.executable, "-m", "dlrm.export", str(ckpt), str(tmp_path / "model.pt")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_refused(result.returncode, result.stderr, str(ckpt / METADATA), "os.system", out=tmp_path / "model.pt")
    assert not marker.exists()
