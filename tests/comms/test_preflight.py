"""dlrm.comms.preflight: measured busbw against the topology's, and a verdict naming the slow scope."""

from __future__ import annotations

import json

import pytest

from dlrm.comms import load_topology
from dlrm.comms.preflight import expected_busbw_GBps, main, verdict
from tests.helpers.families import PAIR, runs


def test_expected_busbw_tends_to_the_link_bandwidth_for_large_messages():
    """nccl-tests' busbw is defined so that a bandwidth-bound collective shows the link's bandwidth:
    the model's expectation for 1 GiB is within 1% of the topology's figure at each level."""
    topo = load_topology("dgx_h100_multinode")
    g = topo.ranks_per_node
    for c in ("allreduce", "alltoall"):
        assert expected_busbw_GBps(topo, g, c, "intra", 2**30) == pytest.approx(topo.intra_node.bandwidth_GBps, 0.01)
        assert expected_busbw_GBps(topo, g, c, "inter", 2**30) == pytest.approx(topo.inter_node.bandwidth_GBps, 0.01)
        world = expected_busbw_GBps(topo, g, c, "world", 2**30)
        assert 0 < world <= topo.intra_node.bandwidth_GBps  # two levels: no faster than the faster one


def row(collective, scope, busbw, expected):
    return {
        "collective": collective,
        "scope": scope,
        "group_size": 8,
        "busbw_GBps": busbw,
        "expected_busbw_GBps": expected,
        "fraction": busbw / expected,
    }


def test_verdict_names_the_slow_scope_and_what_to_check():
    rows = [row("allreduce", "intra", 400, 450), row("alltoall", "inter", 5, 50), row("allreduce", "inter", 30, 50)]
    passed, lines = verdict(rows, 0.7)
    assert not passed
    assert [line.split()[-1] for line in lines[:3]] == ["ok", "SLOW", "SLOW"]
    (fail,) = [line for line in lines if line.startswith("FAIL")]
    assert "inter alltoall reached 10% of the 50.00 GB/s" in fail and "NCCL_IB_HCA" in fail  # the worst of the scope
    passed, lines = verdict(rows[:1], 0.7)
    assert passed and lines[-1].startswith("PASS")


PREFLIGHT = ["--topology", "cpu", "--bytes", "64K", "--warmup", "1", "--iters", "2", "--out", str(PAIR.dir("pf"))]


@pytest.mark.slow
@runs(verdicts=PAIR.job(main, PREFLIGHT))  # the command's main on each rank
def test_two_ranks_measure_and_report(verdicts):
    """2 Gloo ranks (the cpu topology): rank 0 returns the verdict it wrote; the figures are consistent
    (no assertion on speed: this machine's loopback is not the topology's promise)."""
    passed, other = verdicts
    assert other is None and passed in (True, False)
    report = json.loads((PAIR.dir("pf") / "preflight.json").read_text())
    assert report["passed"] is passed and report["backend"] == "gloo" and report["topology"] == "cpu"
    assert [(r["collective"], r["scope"]) for r in report["results"]] == [("allreduce", "intra"), ("alltoall", "intra")]
    for r in report["results"]:
        assert r["expected_busbw_GBps"] > 0 and r["fraction"] == pytest.approx(
            r["busbw_GBps"] / r["expected_busbw_GBps"]
        )
    assert passed == all(r["fraction"] >= 0.7 for r in report["results"])
