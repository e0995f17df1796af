"""Cost model formulas against hand-computed values, their limits, fitting, step_comm_time, bad input."""

import json
import math

import pytest

from dlrm.comms import load_topology
from dlrm.comms.costmodel import (
    COLLECTIVES,
    FABRICS,
    CommsError,
    Link,
    backend_of,
    busbw_factor,
    coefficients,
    collective_time,
    level_time,
    ring_time,
    step_comm_time,
    two_level_time,
    world_time,
)
from dlrm.comms.fit import fit_alpha_beta

ALPHA, B = 10e-6, 1e9  # 10 us per message, 1 GB/s per rank


def link(fabric):
    return Link(fabric, ALPHA, B)


def test_ring_allreduce_is_2_p_minus_1_steps_of_n_over_p():
    n, p = 4096, 4
    assert collective_time("allreduce", link("ring"), p, n) == pytest.approx(2 * (p - 1) * (ALPHA + (n / p) / B))


def test_alltoall_at_8_ranks_by_hand():
    n, p = 8 * 2**20, 8
    # fully connected: one step, n/8 to each of 7 peers, each over its own link of B/7
    assert collective_time("alltoall", link("fully_connected"), p, n) == pytest.approx(ALPHA + (n / 8) / (B / 7))
    # ring: 7 store-and-forward steps; the busiest link carries (1+2+...+7) n/8 = 3.5 n bytes
    assert collective_time("alltoall", link("ring"), p, n) == pytest.approx(7 * ALPHA + 3.5 * n / B)
    # switch: 7 messages through one port of B
    assert collective_time("alltoall", link("switch"), p, n) == pytest.approx(7 * ALPHA + 7 / 8 * n / B)


def test_switch_uses_log2_steps_and_fc_one_step():
    n = 2**20
    assert collective_time("reduce_scatter", link("switch"), 8, n) == pytest.approx(3 * ALPHA + 7 / 8 * n / B)
    assert collective_time("allgather", link("fully_connected"), 8, n) == pytest.approx(ALPHA + 7 / 8 * n / B)
    assert collective_time("allreduce", link("fully_connected"), 8, n) == pytest.approx(2 * ALPHA + 14 / 8 * n / B)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("fabric", FABRICS)
def test_limits(collective, fabric):
    assert collective_time(collective, link(fabric), 1, 2**30) == 0.0  # one rank sends nothing
    assert two_level_time(collective, link(fabric), link("switch"), 1, 1, 2**30) == 0.0
    # large messages: the bandwidth term dominates
    steps, factor = coefficients(collective, fabric, 8)
    n = 1e13
    assert collective_time(collective, link(fabric), 8, n) / (factor * n / B) == pytest.approx(1.0, rel=1e-6)
    # fully connected is never slower than a ring at equal per-rank bandwidth
    for n in (1e3, 1e6, 1e9):
        fc, ring = (collective_time(collective, link(f), 8, n) for f in ("fully_connected", "ring"))
        assert fc <= ring


def test_bandwidth_optimal_factors_equal_busbw_factors():
    for c in COLLECTIVES:
        assert coefficients(c, "fully_connected", 8)[1] == pytest.approx(busbw_factor(c, 8))
    assert busbw_factor("allreduce", 2) == 1.0 and busbw_factor("alltoall", 4) == 0.75


def test_two_level_one_node_equals_one_level_and_two_nodes_by_hand():
    intra, inter, n = Link("switch", 2e-6, 400e9), Link("switch", 5e-6, 50e9), 2**26
    for c in ("allreduce", "alltoall"):
        assert two_level_time(c, intra, inter, 1, 8, n) == pytest.approx(collective_time(c, intra, 8, n))
    # 2 nodes x 8: alltoall = max(intra alltoall of n/2 among 8, inter alltoall of n among 2)
    expected = max(7 * 2e-6 + 7 / 8 * (n / 2) / 400e9, 5e-6 + 0.5 * n / 50e9)
    assert two_level_time("alltoall", intra, inter, 2, 8, n) == pytest.approx(expected)
    # allreduce = intra RS(n) + inter AR(n/8 among 2) + intra AG(n)
    rs = 3 * 2e-6 + 7 / 8 * n / 400e9
    assert two_level_time("allreduce", intra, inter, 2, 8, n) == pytest.approx(2 * rs + 2 * 5e-6 + (n / 8) / 50e9)


@pytest.mark.parametrize(
    "collective,fabric,p",
    [
        ("allreduce", "ring", 8),
        ("alltoall", "fully_connected", 8),
        ("reduce_scatter", "switch", 4),
        ("alltoall", "ring", 2),
    ],
)
def test_fit_recovers_alpha_and_beta(collective, fabric, p):
    truth = Link(fabric, 23e-6, 3.7e9)
    sizes = [2**k for k in range(10, 27)]
    times = [collective_time(collective, truth, p, n) for n in sizes]
    fit = fit_alpha_beta(collective, fabric, p, sizes, times)
    assert fit.alpha_s == pytest.approx(23e-6, rel=1e-6)
    assert fit.bandwidth_Bps == pytest.approx(3.7e9, rel=1e-6)
    assert fit.rel_rms < 1e-9


def test_fit_bad_input():
    with pytest.raises(CommsError, match="p=1"):
        fit_alpha_beta("allreduce", "ring", 1, [1, 2], [1.0, 2.0])
    with pytest.raises(CommsError, match="too few points"):
        fit_alpha_beta("allreduce", "ring", 2, [1024, 1024], [1.0, 2.0])


def test_unknown_collective_and_fabric_name_the_value():
    with pytest.raises(CommsError, match="'broadcast'.*allreduce"):
        collective_time("broadcast", link("ring"), 4, 1024)
    with pytest.raises(CommsError, match="'torus'.*ring"):
        coefficients("allreduce", "torus", 4)
    with pytest.raises(CommsError, match="-1"):
        collective_time("allreduce", link("ring"), 4, -1)


def test_step_comm_time_dgx_two_nodes_by_hand():
    topo = load_topology("dgx_h100_multinode")  # 2 x 8, NVSwitch 450 GB/s, 2 us; NIC 50 GB/s, 5 us
    t = step_comm_time(topo, alltoall_bytes_intra=7e6, alltoall_bytes_inter=8e6, allreduce_bytes=4e6)
    assert t["alltoall_intra_s"] == pytest.approx(7 * 2e-6 + 7e6 / 450e9)
    assert t["alltoall_inter_s"] == pytest.approx(5e-6 + 8e6 / 50e9)
    assert t["alltoall_s"] == max(t["alltoall_intra_s"], t["alltoall_inter_s"])
    rs = 3 * 2e-6 + 7 / 8 * 4e6 / 450e9
    assert t["allreduce_s"] == pytest.approx(2 * rs + 2 * 5e-6 + 0.5e6 / 50e9)
    assert t["total_s"] == pytest.approx(t["alltoall_s"] + t["allreduce_s"])


def test_step_comm_time_limits_and_errors():
    cpu = load_topology("cpu")  # ranks_per_node=None: taken from the launcher
    with pytest.raises(CommsError, match="ranks_per_node=LOCAL_WORLD_SIZE"):
        step_comm_time(cpu, 0, 0, 1e6)
    assert step_comm_time(cpu, 0, 0, 1e6, ranks_per_node=1)["total_s"] == 0.0
    with pytest.raises(CommsError, match="alltoall_bytes_inter=5.*nodes=1"):
        step_comm_time(cpu, 10, 5, 0, ranks_per_node=2)
    with pytest.raises(CommsError, match="allreduce_bytes=-1"):
        step_comm_time(cpu, 0, 0, -1, ranks_per_node=2)
    # a ring carries each byte p/2 hops on average
    ring = load_topology("zion")
    ring.intra_node.fabric = "ring"
    t = step_comm_time(ring, 7e6, 0, 0)
    assert t["alltoall_intra_s"] == pytest.approx(7 * 2e-6 + 7e6 * 4 / 300e9)


# --- backends -------------------------------------------------------------------------------------------
# Links like the emulated 2 x 2 cluster's at 0.5 Gbit/s per node uplink: loopback 1 GB/s, 250 us;
# inter-node 0.0625 GB/s per node = 31.25 MB/s per rank, 250 us.
EMU_INTRA, EMU_INTER = Link("switch", 250e-6, 1e9), Link("switch", 250e-6, 31.25e6)


def test_gloo_reduce_scatter_is_a_whole_allreduce_at_one_level():
    n = 4 * 2**20
    for p, link_ in ((2, EMU_INTRA), (2, EMU_INTER), (4, link("switch"))):
        ar = 2 * (p - 1) * link_.alpha_s + 2 * (p - 1) / p * n / link_.bandwidth_Bps  # Gloo's ring allreduce
        assert level_time("reduce_scatter", link_, p, n, "gloo") == pytest.approx(ar)
        assert level_time("allreduce", link_, p, n, "gloo") == pytest.approx(ar)
        rs = (p - 1) / p * n / link_.bandwidth_Bps  # NCCL's reduce-scatter: half the bandwidth term
        assert level_time("reduce_scatter", link_, p, n, "nccl") - rs == pytest.approx(
            coefficients("reduce_scatter", "switch", p)[0] * link_.alpha_s
        )
    # 2 inter-node ranks at 0.5 Gbit/s, 4 MiB: 0.5 ms + 4 MiB / 31.25 MB/s = 134.7 ms, twice NCCL's 67.6 ms
    assert level_time("reduce_scatter", EMU_INTER, 2, n, "gloo") == pytest.approx(2 * 250e-6 + n / 31.25e6)


def test_gloo_runs_allreduce_and_allgather_as_rings_on_any_fabric():
    n, p = 2**20, 8
    for fabric in FABRICS:
        assert level_time("allreduce", link(fabric), p, n, "gloo") == pytest.approx(14 * ALPHA + 14 / 8 * n / B)
        assert level_time("allgather", link(fabric), p, n, "gloo") == pytest.approx(7 * ALPHA + 7 / 8 * n / B)
        # alltoall: direct sends, the fabric's formula on both backends
        assert level_time("alltoall", link(fabric), p, n, "gloo") == collective_time("alltoall", link(fabric), p, n)
        assert level_time("allreduce", link(fabric), p, n, "nccl") == collective_time("allreduce", link(fabric), p, n)


def test_flat_ring_over_two_nodes_by_hand():
    """Ranks 0,1 on node 0, 2,3 on node 1, a ring 0-1-2-3-0: each node's uplink carries one ring edge each
    way, 2(p-1)/p n = 1.5 n for an allreduce, at the node's whole rate 2 x 31.25 MB/s; the loopback edges
    (1 GB/s) are faster. 6 steps of 250 us."""
    n = 4 * 2**20  # the 4 MiB of the stored benchmark: 109.1 ms measured at 0.5 Gbit/s
    t = ring_time("allreduce", EMU_INTRA, EMU_INTER, 2, 2, n)
    assert t == pytest.approx(6 * 250e-6 + 1.5 * n / 62.5e6)  # 102.2 ms (107.4 ms at tbf's delivered 0.95x)
    assert ring_time("allgather", EMU_INTRA, EMU_INTER, 2, 2, n) == pytest.approx(3 * 250e-6 + 0.75 * n / 62.5e6)
    # the two-level model it replaces for Gloo: 2 x loopback RS + inter allreduce of n/2 at 31.25 MB/s
    hier = 2 * (250e-6 + n / 2 / 1e9) + 2 * 250e-6 + (n / 2) / 31.25e6
    assert two_level_time("allreduce", EMU_INTRA, EMU_INTER, 2, 2, n) == pytest.approx(hier)  # 71.8 ms
    # at 2 Gbit/s: 6 x 250 us + 1.5 n / 250 MB/s = 26.7 ms (28.3 ms measured)
    fast = Link("switch", 250e-6, 125e6)
    assert ring_time("allreduce", EMU_INTRA, fast, 2, 2, n) == pytest.approx(6 * 250e-6 + 1.5 * n / 250e6)


def test_flat_ring_limits_and_the_slower_level_sets_the_pace():
    n = 2**24
    intra, inter = Link("switch", 2e-6, 1e9), Link("switch", 9e-6, 0.75e9)
    assert ring_time("allreduce", intra, inter, 1, 4, n) == pytest.approx(6 * 2e-6 + 1.5 * n / 1e9)  # one node
    assert ring_time("allreduce", intra, inter, 4, 1, n) == pytest.approx(6 * 9e-6 + 1.5 * n / 0.75e9)  # 1 per node
    # 2 x 2: the uplink's 1.5 GB/s for the node beats the loopback's 1 GB/s: the loopback edges set the pace
    assert ring_time("allreduce", intra, inter, 2, 2, n) == pytest.approx(6 * 9e-6 + 1.5 * n / 1e9)
    assert ring_time("reduce_scatter", intra, inter, 2, 2, n) == pytest.approx(3 * 9e-6 + 0.75 * n / 1e9)
    assert ring_time("allreduce", intra, inter, 1, 1, n) == 0.0
    with pytest.raises(CommsError, match="alltoall"):
        ring_time("alltoall", intra, inter, 2, 2, n)
    with pytest.raises(CommsError, match="nodes=0"):
        ring_time("allreduce", intra, inter, 0, 2, n)


def test_world_time_by_backend():
    n = 4 * 2**20
    args = (EMU_INTRA, EMU_INTER, 2, 2, n)
    for c in COLLECTIVES:  # NCCL: the two-level scheme, as before
        assert world_time(c, *args, "nccl") == two_level_time(c, *args)
    assert world_time("alltoall", *args, "gloo") == two_level_time("alltoall", *args)
    assert world_time("allreduce", *args, "gloo") == ring_time("allreduce", *args)
    assert world_time("reduce_scatter", *args, "gloo") == ring_time("allreduce", *args)  # 102.2 ms, 113.2 measured
    assert world_time("allgather", *args, "gloo") == ring_time("allgather", *args)
    with pytest.raises(CommsError, match="'mpi'.*gloo"):
        world_time("allreduce", *args, "mpi")


def test_gloo_hierarchical_pays_an_allreduce_for_its_intra_node_reduce_scatter():
    n = 4 * 2**20
    intra_ar = 2 * 250e-6 + n / 1e9  # 2 ranks: reduce-scatter run as an allreduce
    inter_ar = 2 * 250e-6 + (n / 2) / 31.25e6
    intra_ag = 250e-6 + 0.5 * n / 1e9
    got = two_level_time("allreduce", EMU_INTRA, EMU_INTER, 2, 2, n, "gloo")
    assert got == pytest.approx(intra_ar + inter_ar + intra_ag)
    assert got - two_level_time("allreduce", EMU_INTRA, EMU_INTER, 2, 2, n) == pytest.approx(250e-6 + 0.5 * n / 1e9)


def test_backend_of_a_topology_and_step_comm_time_on_gloo():
    assert backend_of(load_topology("emu_2x2")) == "gloo"  # auto on cpu
    assert backend_of(load_topology("dgx_h100_multinode")) == "nccl"  # auto on cuda
    topo = load_topology("emu_2x2")
    topo.backend = "nccl"
    assert backend_of(topo) == "nccl"
    emu = load_topology("emu_2x2")  # 2 nodes x 2 ranks
    intra, inter = Link.from_config(emu.intra_node, "allreduce"), Link.from_config(emu.inter_node, "allreduce")
    n = 1e6
    flat = step_comm_time(emu, 0, 0, n)["allreduce_s"]
    # DDP's flat allreduce: one ring over 4 ranks, 6 steps, 1.5 n through each node's uplink (2 ranks' share)
    rate = min(intra.bandwidth_Bps, 2 * inter.bandwidth_Bps)
    assert flat == pytest.approx(6 * max(intra.alpha_s, inter.alpha_s) + 1.5 * n / rate)
    hier = step_comm_time(emu, 0, 0, n, dense_allreduce="hierarchical")["allreduce_s"]
    assert hier == pytest.approx(two_level_time("allreduce", intra, inter, 2, 2, n, "gloo"))
    with pytest.raises(CommsError, match="dense_allreduce='tree'"):
        step_comm_time(emu, 0, 0, n, dense_allreduce="tree")


@pytest.mark.parametrize("name", ["cpu", "cpu_2x2", "zion", "dgx_h100", "dgx_h100_multinode"])
def test_topology_configs_load_against_the_schema(name):
    topo = load_topology(name)
    assert topo.name == name
    for level in (topo.intra_node, topo.inter_node):
        assert level.fabric in FABRICS and level.bandwidth_GBps > 0 and level.latency_us >= 0
    if topo.device == "cuda":
        assert topo.ranks_per_node == 8 and topo.hbm_GB > 0


def test_unknown_topology_names_the_choices():
    with pytest.raises(FileNotFoundError, match="dgx_h100"):
        load_topology("nope")


def _bench_file(tmp_path, **change):
    from dlrm.comms.measure import SCHEMA, summarize

    truth = Link("switch", 50e-6, 2e9)
    rows = [
        summarize(c, "world", 2, n, [collective_time(c, truth, 2, n)] * 3)
        for c in ("allreduce", "alltoall")
        for n in (1024, 4096, 16384, 65536)
    ]
    data = {
        "schema": SCHEMA,
        "backend": "gloo",
        "world_size": 2,
        "nodes": 1,
        "intra_fabric": "switch",
        "inter_fabric": "switch",
        "results": rows,
        **change,
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path


def test_report_model_and_bench(tmp_path):
    from dlrm.comms import report

    text = report.main(
        ["--bench", str(_bench_file(tmp_path)), "--out", str(tmp_path / "r"), "--max-bytes", "64K", "--max-nodes", "4"]
    )
    assert "alltoall/fully_connected" in text and "| 4 |" in text
    assert "| allreduce | world | 2 | switch | 50.0 | 2.000 |" in text  # fitted back from the model
    for name in ("report.md", "report.png", "bench_vs_model.png"):
        assert (tmp_path / "r" / name).stat().st_size > 0


def test_report_bad_option_is_a_user_error():
    """A usage error is one `error:` line and exit 2 (its __main__), not argparse's usage block."""
    from dlrm.common.errors import UserError
    from dlrm.comms import report

    with pytest.raises(UserError, match="--ranks: invalid int value: 'q'"):
        report.main(["--ranks", "q"])


@pytest.mark.parametrize(
    "change,match",
    [
        ({"schema": "other/1"}, "schema 'other/1'"),
        ({"results": []}, "no 'results'"),
        ({"results": [{"collective": "allreduce"}]}, r"results\[0\] lacks scope"),
    ],
)
def test_report_rejects_a_bench_file_of_the_wrong_shape(tmp_path, change, match):
    from dlrm.comms.report import load_bench

    with pytest.raises(CommsError, match=match + ".*dlrm.comms.measure"):
        load_bench(str(_bench_file(tmp_path, **change)))


def test_report_rejects_missing_and_non_json_files(tmp_path):
    from dlrm.comms.report import load_bench

    with pytest.raises(CommsError, match="does not exist"):
        load_bench(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(CommsError, match="not JSON"):
        load_bench(str(bad))


@pytest.mark.parametrize(
    "sizes,times",
    [
        ([1024, 2048], [1e-4, 1e-4]),  # LAPACK may return beta ~ +-1e-23 here, depending on the CPU
        ([1024, 2048, 4096, 8192], [1e-4, 1e-4 * (1 + 1e-15), 1e-4, 1e-4 * (1 - 1e-15)]),
        ([2**k for k in range(10, 20)], [1e-4 * (1 + 1e-12 * k) for k in range(10)]),  # share ~1e-12: rounding
    ],
)
def test_inf_bandwidth_when_sizes_too_small(sizes, times):
    fit = fit_alpha_beta("alltoall", "switch", 2, sizes, times)
    assert math.isinf(fit.bandwidth_Bps)
    assert fit.alpha_s == pytest.approx(1e-4, rel=1e-9)  # refitted alone: the mean time per step


def test_bandwidth_hidden_by_noise_is_inf_and_a_clear_slope_is_kept():
    import numpy as np

    rng = np.random.default_rng(0)
    sizes = [2**k for k in range(10, 20)]
    flat = 1e-4 * (1 + 0.05 * rng.standard_normal(len(sizes)))  # 5% noise, no size dependence
    assert math.isinf(fit_alpha_beta("alltoall", "switch", 2, sizes, flat).bandwidth_Bps)
    truth = Link("switch", 1e-4, 1e9)  # bandwidth term 0.5 x 512 KiB / 1 GB/s = 2.6 alpha at the largest size
    noisy = [collective_time("alltoall", truth, 2, n) * (1 + 0.01 * e) for n, e in zip(sizes, flat / 1e-4 - 1)]
    fit = fit_alpha_beta("alltoall", "switch", 2, sizes, noisy)
    assert fit.bandwidth_Bps == pytest.approx(1e9, rel=0.2)
