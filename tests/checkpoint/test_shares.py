"""Who hashes what: saving, each rank digests only the files it wrote itself (and `.metadata`, to see
that it shares rank 0's directory); loading, each rank checks only its share of the files, and a
file corrupt or missing in one rank's share makes every rank refuse alike (2 Gloo ranks)."""

from __future__ import annotations

import json

import pytest

from dlrm.checkpoint import METADATA
from tests.helpers.harness import launch
from tests.helpers.workers import checkpoint_shares


@pytest.mark.slow
def test_digests_by_writer_and_load_checks_by_share(tmp_path):
    ranks = launch(checkpoint_shares, 2, str(tmp_path))
    files = set(json.loads((tmp_path / "step_00000001" / "manifest.json").read_text())["files"])
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
