"""Deltas: a chain of deltas applied to an export equals the full export at that step, bit for bit,
on a model whose tables are split across two ranks; each delta holds only the rows looked up."""

from __future__ import annotations

import pytest
import torch

from dlrm.deltas.__main__ import main as deltas_main
from dlrm.deltas.publish import read_manifest
from dlrm.export import export
from tests.helpers.equivalence import tiny
from tests.helpers.families import PAIR, runs
from tests.helpers.workers import train_summary

CKPT, DELTAS = PAIR.dir("deltas_ckpt"), PAIR.dir("deltas")
RUN = PAIR.job(
    train_summary,
    tiny(
        "sharding=row_wise",
        "optim=rowwise_adagrad",
        "trainer.max_steps=12",
        f"checkpoint.dir={CKPT}",
        "checkpoint.every_steps=4",
        "checkpoint.keep=3",
        f"deltas.dir={DELTAS}",
        "deltas.every_steps=2",
    ),
)


@pytest.mark.slow
@runs(run=RUN)
def test_deltas_applied_to_an_export_equal_the_full_export(tmp_path, capsys, run):
    assert [summary["steps"] for summary in run] == [12, 12]
    entries = read_manifest(DELTAS)
    assert [(e["base_step"], e["step"]) for e in entries] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    base, full = tmp_path / "at4.pt", tmp_path / "at12.pt"
    export(CKPT / "step_00000004", base)
    export(CKPT / "step_00000012", full)
    out = tmp_path / "applied.pt"
    rc = deltas_main(["apply", str(base), str(DELTAS), "--out", str(out)])  # `python -m dlrm.deltas apply`
    assert rc == 0, capsys.readouterr().err
    applied = torch.load(out, weights_only=True)
    expected = torch.load(full, weights_only=True)
    assert applied["step"] == 12 and applied["sha256"] == expected["sha256"]
    for name, tensor in expected["state_dict"].items():
        assert torch.equal(applied["state_dict"][name], tensor), name
    before = torch.load(base, weights_only=True)["state_dict"]
    changed = sum(int((before[k] != v).any(dim=-1).sum()) for k, v in expected["state_dict"].items() if v.dim() == 2)
    assert changed > 0, "the steps must change rows, or the test proves little"
    # each delta holds the rows its steps looked up, not the tables
    total_rows = sum(t.shape[0] for k, t in expected["state_dict"].items() if "embedding_bags" in k)
    assert all(sum(e["rows"].values()) < total_rows for e in entries)


def test_a_chain_that_does_not_reach_the_step_is_refused(tmp_path, capsys):
    rc = deltas_main(["list", str(tmp_path)])  # `python -m dlrm.deltas list DIR`
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and "holds no deltas" in err
