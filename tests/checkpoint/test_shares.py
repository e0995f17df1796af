"""Who hashes what: saving, each rank digests only the files it wrote itself (and `.metadata`, to see
that it shares rank 0's directory); loading, each rank checks only its share of the files, and a
file corrupt or missing in one rank's share makes every rank refuse alike (2 Gloo ranks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dlrm.checkpoint import METADATA, Checkpointer, CheckpointError, checkpointer, safe_load, step_tensor
from tests.helpers.families import PAIR, runs
from tests.helpers.harness import default_group


def checkpoint_shares(root: str) -> dict:
    """Save a small checkpoint with the Checkpointer (each rank its own tensors, rank 0 the step), load
    it, then load damaged copies (a byte flipped, verified; a file removed, not verified) of a file in
    rank 1's share. Returns the names of the files this rank hashed while saving (`file_digest`) and
    checked while loading the intact one (`check_file`), whether it loaded, and the damaged loads' errors."""
    pg, rank = default_group(), dist.get_rank()
    hashed, checked = [], []
    # Record each call of the library's file_digest and check_file (restored below).
    real_digest, real_check = checkpointer.file_digest, safe_load.check_file
    checkpointer.file_digest = lambda file: hashed.append(file.name) or real_digest(file)  # rank 0: .metadata.tmp too
    safe_load.check_file = lambda path, name, *a, **k: checked.append(name) or real_check(path, name, *a, **k)

    def state(value: float) -> dict:
        return {
            "model": {f"rank{rank}.t{i}": torch.full((64, 4), value + i) for i in range(3)},
            "progress": {"step": step_tensor(1 if value else 0)},
        }

    def load_error(path: Path, verify: bool) -> str | None:
        try:
            safe_load.load_checkpoint(path, state(0.0), verify, pg)
        except CheckpointError as e:
            return str(e)
        return None

    try:
        saved = Checkpointer(Path(root), 2, pg, rank == 0).save(1, state(1.0), {})
        checked.clear()
        loaded = state(0.0)
        safe_load.load_checkpoint(saved, loaded, True, pg)
        same = all(torch.equal(a, b) for a, b in zip(loaded["model"].values(), state(1.0)["model"].values()))
        result = {"hashed": list(hashed), "checked": list(checked), "loaded": same}
        shares = sorted(p.name for p in saved.glob("*.distcp"))[1::2]  # rank 1's, as open_checkpoint splits them
        corrupt, missing = Path(root) / "corrupt", Path(root) / "missing"
        if rank == 0:
            shutil.copytree(saved, corrupt)
            shutil.copytree(saved, missing)
            data = bytearray((corrupt / shares[0]).read_bytes())
            data[len(data) // 2] ^= 0xFF
            (corrupt / shares[0]).write_bytes(bytes(data))
            (missing / shares[0]).unlink()
        dist.barrier()
        result.update(damaged=shares[0], corrupt=load_error(corrupt, True), missing=load_error(missing, False))
        return result
    finally:
        checkpointer.file_digest, safe_load.check_file = real_digest, real_check


ROOT = PAIR.dir("shares")


@pytest.mark.slow
@runs(ranks=PAIR.job(checkpoint_shares, str(ROOT)))
def test_digests_by_writer_and_load_checks_by_share(ranks):
    files = set(json.loads((ROOT / "step_00000001" / "manifest.json").read_text())["files"])
    data = files - {METADATA}
    for rank, result in enumerate(ranks):
        own = {name for name in data if name.startswith(f"__{rank}_")}  # DCP names a rank's files __RANK_*
        assert own, "each rank wrote files of its own"
        hashed = sorted(name for name in result["hashed"] if name != f"{METADATA}.tmp")  # DCP's, before its rename
        assert hashed == sorted(own | {METADATA}), rank  # its own files, each once
        assert result["loaded"]
    assert set(ranks[0]["hashed"]) | set(ranks[1]["hashed"]) == files | {f"{METADATA}.tmp"}
    checked = [set(r["checked"]) - {METADATA} for r in ranks]
    assert not checked[0] & checked[1] and checked[0] | checked[1] == data  # a share each, all covered
    assert all(r["checked"].count(METADATA) == 1 for r in ranks)  # stat before reading it
    damaged = ranks[0]["damaged"]
    assert damaged in checked[1] and damaged not in checked[0]
    for case, says in (("corrupt", "is corrupt"), ("missing", "is missing")):
        assert ranks[0][case] == ranks[1][case], case  # every rank raises alike
        assert f"{damaged} {says}" in ranks[0][case], ranks[0][case]
