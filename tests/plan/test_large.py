"""`python -m dlrm.plan` above LARGE_WORLD ranks: the narrowed search of dlrm.plan.large."""

import json

from dlrm import plan as dplan
from dlrm.plan.large import LARGE_WORLD

NODES = LARGE_WORLD // 8 + 1  # just above the threshold, 8 ranks per node
BIG = ["model=tiny", "topology=dgx_h100_multinode", f"topology.nodes={NODES}", f"data.global_batch_size={NODES * 16}"]


def run(capsys, *args):
    code = dplan.main(["--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_large_world_narrows_the_search_and_says_so(capsys):
    report, err = run(capsys, *BIG)
    assert report["search"].startswith("narrowed") and report["topology"]["world_size"] > LARGE_WORLD
    assert "uniform proposer" in err and "--proposer exact" in err
    assert all(t["sharding_type"] not in ("row_wise", "grid_shard") for t in report["plan"])


def test_pinned_tables_keep_their_type(capsys):
    # (row_wise itself cannot be pinned here: TorchRec cannot cut tiny's 100 rows over 264 ranks)
    report, _ = run(capsys, *BIG, "+sharding.per_table.t_C1=column_wise")
    kinds = {t["table"]: t["sharding_type"] for t in report["plan"]}
    assert kinds["t_C1"] == "column_wise"


def test_exact_and_small_worlds_search_fully(capsys):
    small, err = run(capsys, "model=tiny", "topology=dgx_h100_multinode", "data.global_batch_size=512")
    assert small["search"] == "full" and "uniform proposer" not in err
    exact, err = run(capsys, "--proposer", "exact", *BIG)
    assert exact["search"] == "full" and "uniform proposer" not in err
