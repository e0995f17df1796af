"""One small real checkpoint and helpers to damage it (the hostile checkpoint tests).

`saved_checkpoints` trains the tiny model on 2 Gloo ranks (row-wise Adagrad: optimizer state in
the files; a job of the PAIR family) and keeps checkpoints at steps 2 and 4: per test, `ckpts` gives
a private copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dlrm.checkpoint import file_digest, open_checkpoint, write_manifest
from dlrm.export import main as export_main
from tests.helpers.families import FIXTURE_READS, PAIR, Overrides
from tests.helpers.workers import train_summary

OLD, NEW = "step_00000002", "step_00000004"


SAVED = PAIR.job(
    train_summary,
    Overrides(
        "model=tiny",
        "optim=rowwise_adagrad",
        "sharding=table_wise",
        "data.global_batch_size=96",
        "data.eval_batches=1",
        "trainer.max_steps=4",
        "trainer.progress=none",
        f"checkpoint.dir={PAIR.dir('saved_checkpoints')}",
        "checkpoint.every_steps=2",
        "checkpoint.keep=2",
    ),
)
FIXTURE_READS["saved_checkpoints"] = SAVED  # declared for the tests that use the fixture, ordered as readers


@pytest.fixture(scope="session")
def saved_checkpoints() -> Path:
    """checkpoints/{step_00000002, step_00000004} of a 2-rank run, a job of the PAIR family (read-only:
    tests copy it)."""
    PAIR.declare(SAVED, "saved_checkpoints").results()
    root = PAIR.dir("saved_checkpoints")
    assert sorted(p.name for p in root.iterdir()) == [OLD, NEW]
    return root


@pytest.fixture
def ckpts(saved_checkpoints, tmp_path) -> Path:
    """A private copy of the saved checkpoints directory."""
    return Path(shutil.copytree(saved_checkpoints, tmp_path / "checkpoints"))


def digests(directory: Path) -> dict:
    return {p.name: file_digest(p) for p in sorted(directory.iterdir())}


def resign(ckpt: Path) -> None:
    """Recompute the manifest's file list and checksums, as an attacker who writes every file can."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"] = {p.name: file_digest(p) for p in ckpt.iterdir() if p.name != "manifest.json"}
    write_manifest(ckpt, manifest)


def real_metadata(ckpt: Path):
    """The checkpoint's DCP metadata (verified: read through the trainer's own allowlist)."""
    return open_checkpoint(ckpt)[1]


def flip(file: Path, offset: int, xor: int = 0xFF) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= xor
    file.write_bytes(bytes(data))


def run_export(ckpt: Path, out: Path, capsys, *flags: str) -> tuple[int, str]:
    """`python -m dlrm.export ckpt out` in-process: (exit status, stderr)."""
    capsys.readouterr()
    rc = export_main([str(ckpt), str(out), *flags])
    return rc, capsys.readouterr().err


def assert_refused(rc: int, err: str, *names: str, out: Path | None = None) -> str:
    """Exit 2, exactly one line `error: ...` naming `names` and a fix, no traceback, no output."""
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert any(
        fix in err
        for fix in (
            "trainer.resume=",
            "use another checkpoint",
            "give ",
            "same optim",
            "re-create",
            "pick ",
            "export a checkpoint",
            "choose another",
        )
    ), err
    if out is not None:
        assert not out.exists() and not any(out.parent.glob(f".{out.name}.tmp")), "an output was left behind"
    return lines[0]


def step_file(ckpt: Path) -> str:
    """The data file holding progress.step."""
    md = real_metadata(ckpt)
    return next(info.relative_path for index, info in md.storage_data.items() if index.fqn == "progress.step")
