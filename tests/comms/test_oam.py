"""The vendor-neutral OAM box (conf/topology/oam_mi300x.yaml): it composes, validates, maps to the
'cuda' device and the 'nccl' (RCCL) backend like any GPU box, plans MLPerf DCNv2, and its fully connected
fabric compares with a ring and a switch of the same per-rank bandwidth as the cost model says it should."""

from __future__ import annotations

import dataclasses

import pytest

from dlrm import plan as dplan
from dlrm.comms import load_topology
from dlrm.comms.costmodel import Link, collective_time, step_comm_time
from dlrm.config import validate
from dlrm.config.compose import compose
from dlrm.distributed.topology import backend_for, planner_topology

MLPERF = ["model=mlperf_dcnv2", "data.global_batch_size=65536", "topology=oam_mi300x"]
GB = 1e9


def test_oam_config_composes_validates_and_selects_the_gpu_backend():
    cfg = compose(["topology=oam_mi300x"])
    validate(cfg)
    tp = cfg.topology
    assert (tp.name, tp.nodes, tp.ranks_per_node) == ("oam_mi300x", 1, 8)
    assert tp.intra_node.fabric == "fully_connected" and tp.intra_node.bandwidth_GBps == 448.0  # 7 x 64 GB/s
    assert tp.hbm_GB == 192.0
    # A ROCm build of torch answers to 'cuda' and runs RCCL behind 'nccl': nothing vendor-specific here.
    assert tp.device == "cuda" and backend_for(tp) == "nccl"
    topo = planner_topology(tp, world_size=8, local_world_size=8)
    assert topo.compute_device == "cuda" and topo.world_size == 8
    assert load_topology("oam_mi300x") == tp  # the comms tools read the same figures


@pytest.fixture(scope="module")
def oam_plan():
    return dplan.make_plan(dplan.compose(MLPERF))


def test_mlperf_dcnv2_plans_on_the_oam_box(oam_plan):
    report = oam_plan
    assert report["topology"]["world_size"] == 8 and report["topology"]["capacity_GB"] == 192.0
    mem = report["memory"]
    assert all(m["fits"] for m in mem["per_rank"])
    cm = report["comms"]
    assert cm["alltoall_bytes_inter_mean"] == 0 and cm["alltoall_bytes_intra_mean"] > 0
    assert 0 < cm["time_s"]["total_s"] < 1.0  # seconds per iteration; the model gives about 1 ms


def _with_fabric(tp, fabric):
    return dataclasses.replace(tp, intra_node=dataclasses.replace(tp.intra_node, fabric=fabric))


def test_step_traffic_of_the_plan_on_fully_connected_vs_switch_vs_ring(oam_plan):
    """The plan's own bytes per iteration on the three fabrics at equal per-rank bandwidth."""
    tp = load_topology("oam_mi300x")
    cm = oam_plan["comms"]
    t = {
        f: step_comm_time(
            _with_fabric(tp, f), cm["alltoall_bytes_intra_max"], 0.0, cm["allreduce_bytes"], alltoall_count=3
        )
        for f in ("fully_connected", "switch", "ring")
    }
    # alltoall: a byte crosses one link on fc/switch, p/2 = 4 on a ring; fc pays 1 latency per alltoall, switch 7
    assert t["fully_connected"]["alltoall_s"] < t["switch"]["alltoall_s"] < t["ring"]["alltoall_s"]
    bw = cm["alltoall_bytes_intra_max"] / (tp.intra_node.bandwidth_GBps * GB)
    assert t["switch"]["alltoall_s"] - t["fully_connected"]["alltoall_s"] == pytest.approx(3 * 6 * 2e-6)
    assert t["ring"]["alltoall_s"] == pytest.approx(3 * 7 * 2e-6 + 4 * bw)
    # dense allreduce: the same bandwidth term on all three (bandwidth-optimal); they differ by latency
    # only: 2 steps on fc, 2 log2 8 = 6 on the switch, 2 (8-1) = 14 on the ring, 2 us each
    ar = {f: t[f]["allreduce_s"] for f in t}
    assert ar["switch"] - ar["fully_connected"] == pytest.approx(4 * 2e-6)
    assert ar["ring"] - ar["fully_connected"] == pytest.approx(12 * 2e-6)


# Cost model at 8 ranks with the OAM link figures (2 us, 448 GB/s per rank): what tests/comms/test_costmodel.py
# does not check yet is how the fabrics compare as the message grows (the paper: topology matters most for
# small messages, and for alltoall a ring stays behind at any size).
SMALL, LARGE = 1024, 1 << 30


def _times(collective, n):
    return {f: collective_time(collective, Link(f, 2e-6, 448e9), 8, n) for f in ("fully_connected", "switch", "ring")}


@pytest.mark.parametrize(
    "collective,small_ratios",
    [
        # latency-bound: time ratio = ratio of steps (fc 1 per phase, switch log2 8 = 3, ring 7)
        ("allreduce", {"switch": 3.0, "ring": 7.0}),
        ("reduce_scatter", {"switch": 3.0, "ring": 7.0}),
        ("allgather", {"switch": 3.0, "ring": 7.0}),
        ("alltoall", {"switch": 7.0, "ring": 7.0}),
    ],
)
def test_small_messages_fully_connected_wins_by_the_step_count(collective, small_ratios):
    t = _times(collective, SMALL)
    for fabric, ratio in small_ratios.items():
        assert t[fabric] / t["fully_connected"] == pytest.approx(ratio, rel=0.01)


@pytest.mark.parametrize(
    "collective,large_ring_ratio",
    [
        ("allreduce", 1.0),
        ("reduce_scatter", 1.0),
        ("allgather", 1.0),  # bandwidth-optimal on every fabric
        ("alltoall", 4.0),  # ring: (p-1)/2 n / B against (p-1)/p n / B = 4x at p = 8
    ],
)
def test_large_messages_fabrics_converge_except_the_ring_alltoall(collective, large_ring_ratio):
    t = _times(collective, LARGE)
    assert t["switch"] / t["fully_connected"] == pytest.approx(1.0, rel=0.01)
    assert t["ring"] / t["fully_connected"] == pytest.approx(large_ring_ratio, rel=0.01)
    # and the fabric matters less than at small sizes (or, for the ring alltoall, no less)
    small = _times(collective, SMALL)
    assert t["ring"] / t["fully_connected"] <= small["ring"] / small["fully_connected"]
