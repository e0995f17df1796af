"""`python -m dlrm.plan --scale`: step time projected over node counts (dlrm.plan.projection)."""

import json
import math

import pytest

from dlrm import plan as dplan
from dlrm.plan import planner, projection

TINY = ["model=tiny", "topology=dgx_h100_multinode", "data.global_batch_size=512"]
SCALE = [1, 2, 4, 8]


def run(capsys, *args):
    code = dplan.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def base():
    """(config, tables, dense params, ranks per node) of TINY planned once on one node."""
    cfg = dplan.compose(TINY)
    report, _ = projection.scaling(cfg, None, "default", [1], 4, None)
    return cfg, projection.tables_of(report), report["model"]["dense_params"], report["topology"]["ranks_per_node"]


def rows_of(base, sync_period=4, **topology):
    cfg, tables, dense, g = base
    from dataclasses import replace

    cfg = replace(cfg, topology=replace(cfg.topology, **topology))
    return projection.project(cfg, tables, dense, g, SCALE, sync_period)


def test_json_rows_for_every_node_count_and_mode(capsys):
    code, out, err = run(capsys, "--json", "--scale", "4,1,2", *TINY)
    assert code == 0, err
    rows = json.loads(out)["scaling"]
    assert sorted((r["nodes"], r["dense_sync"]) for r in rows) == sorted(
        (n, m) for n in (1, 2, 4) for m in projection.SYNC_MODES
    )
    for r in rows:
        assert r["ranks"] == 8 * r["nodes"] and r["global_batch"] == 512 * r["nodes"]  # weak scaling
        assert r["plan_nodes"] in (1, 4)  # the faster of the one-node and four-node plans


def test_phases_sum_to_the_step_under_the_overlap_rule(base):
    for r in rows_of(base):
        assert math.isclose(sum(r["phase_s"].values()), r["step_s"], rel_tol=1e-12)
        assert math.isclose(
            r["phase_s"]["allreduce_exposed"],
            max(0.0, r["allreduce_s"] - r["backward_s"]),
            rel_tol=1e-12,
            abs_tol=1e-15,
        )
        assert r["phase_s"]["alltoall"] == max(r["alltoall_intra_s"], r["alltoall_inter_s"])
        assert math.isclose(r["samples_per_s"], r["global_batch"] / r["step_s"], rel_tol=1e-12)


def test_local_sgd_with_period_one_is_allreduce_and_cheaper_otherwise(base):
    by = {(r["nodes"], r["dense_sync"]): r for r in rows_of(base, sync_period=1)}
    for n in SCALE:
        assert by[n, "local_sgd"]["step_s"] == by[n, "allreduce"]["step_s"]
    by4 = {(r["nodes"], r["dense_sync"]): r for r in rows_of(base, sync_period=4)}
    assert by4[8, "local_sgd"]["allreduce_s"] == pytest.approx(by4[8, "allreduce"]["allreduce_s"] / 4)


def test_comm_share_does_not_fall_with_more_nodes(base):
    # A slow network, so the allreduce shows above the backward: the share must not fall as nodes grow.
    rows = [r for r in rows_of(base, inter_node=_slow(base)) if r["dense_sync"] == "allreduce"]
    shares = [r["comm_share"] for r in rows]
    assert all(b >= a - 1e-12 for a, b in zip(shares, shares[1:], strict=False)), shares
    assert shares[-1] > shares[0]


def _slow(base):
    from dataclasses import replace

    return replace(base[0].topology.inter_node, bandwidth_GBps=0.01, latency_us=100.0)


def test_peak_compute_by_hand(base):
    cfg, tables, dense, g = base
    b = 512 / g
    r = rows_of(base)[0]
    dense_s = 3 * 2 * dense * b / (cfg.topology.dense_tflops * 1e12)
    emb_s = 4 * b * sum(t.features * t.pooling * t.dim * 4 for t in tables) / (cfg.topology.mem_bw_GBps * 1e9)
    assert r["phase_s"]["dense_compute"] == pytest.approx(dense_s, rel=1e-9)
    assert r["phase_s"]["embedding_compute"] == pytest.approx(emb_s, rel=1e-9)


def test_measured_phases_replace_the_peak_figures(capsys, tmp_path):
    phases = {
        "data": 0.001,
        "emb_lookup": 0.002,
        "dense_fwd": 0.003,
        "backward": 0.004,
        "optimizer": 0.0005,
        "other": 0.0002,
        "emb_a2a_fwd": 9.0,
    }
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"step_breakdown": {"phase_s": phases}}))
    code, out, err = run(capsys, "--json", "--scale", "1", "--measured", str(path), *TINY, "topology.dense_tflops=null")
    assert code == 0, err
    r = json.loads(out)["scaling"][0]
    assert r["phase_s"]["dense_compute"] == pytest.approx(0.0075)
    assert r["phase_s"]["embedding_compute"] == pytest.approx(0.002)
    assert r["phase_s"]["other"] == pytest.approx(0.0012)
    # the run's own communication calibrates the model's: at one node the projection is the run's phase sum
    assert r["phase_s"]["alltoall"] == pytest.approx(9.0)
    assert r["step_s"] == pytest.approx(sum(phases.values()))
    assert r["calibration_s"]["alltoall"] == pytest.approx(9.0 - max(r["alltoall_intra_s"], r["alltoall_inter_s"]))


def test_calibration_carries_the_one_node_offsets_to_every_node_count(base):
    """With --measured: phase(N) = model(N) + measured(1) - model(1), for the alltoall and the exposed
    allreduce (local SGD's offset / H), each floored at 0."""
    cfg, tables, dense, g = base
    phases = {"dense_fwd": 0.001, "backward": 0.0001, "optimizer": 0.0, "emb_lookup": 0.001, "data": 0.0}
    phases |= {"input_dist": 0.003, "emb_a2a_fwd": 0.004, "grad_a2a": 0.005, "dense_allreduce": 0.002}
    plain = {(r["nodes"], r["dense_sync"]): r for r in projection.project(cfg, tables, dense, g, SCALE, 4, phases)}
    for r in plain.values():
        mode, one = r["dense_sync"], plain[1, "allreduce"]
        a2a_1 = max(one["alltoall_intra_s"], one["alltoall_inter_s"])
        a2a_n = max(r["alltoall_intra_s"], r["alltoall_inter_s"])
        assert r["phase_s"]["alltoall"] == pytest.approx(max(0.0, a2a_n + 0.012 - a2a_1), abs=1e-15)
        offset = 0.002 - max(0.0, one["allreduce_s"] - one["backward_s"])
        offset /= 4 if mode == "local_sgd" else 1
        exposed = max(0.0, r["allreduce_s"] - r["backward_s"])
        assert r["phase_s"]["allreduce_exposed"] == pytest.approx(max(0.0, exposed + offset), abs=1e-15)
        assert math.isclose(sum(r["phase_s"].values()), r["step_s"], rel_tol=1e-12)
    assert plain[1, "allreduce"]["step_s"] == pytest.approx(sum(phases.values()))


def test_flat_allreduce_is_one_ring_with_each_uplink_carrying_one_edge():
    """emu_2x2 (Gloo, 2 x 2): 2(p-1)/p n = 1.5 n through each node's whole uplink (its 2 ranks' share),
    6 steps at the larger latency; once the per-rank rate, 2x too slow."""
    from dlrm.comms.costmodel import Link

    topo = dplan.compose(["topology=emu_2x2"]).topology
    intra, inter = Link.from_config(topo.intra_node, "allreduce"), Link.from_config(topo.inter_node, "allreduce")
    n, alpha = 110e3, max(intra.alpha_s, inter.alpha_s)
    rate = min(intra.bandwidth_Bps, 2 * inter.bandwidth_Bps)
    assert projection.flat_allreduce_time(topo, 2, 2, n) == pytest.approx(6 * alpha + 1.5 * n / rate)
    loopback = 2 * intra.alpha_s + n / intra.bandwidth_Bps  # one node: a 2-rank ring
    assert projection.flat_allreduce_time(topo, 1, 2, n) == pytest.approx(loopback)


def test_out_writes_json_markdown_and_png(capsys, tmp_path):
    code, out, err = run(capsys, "--scale", "1,2", "--out", str(tmp_path), *TINY)
    assert code == 0, err
    rows = json.loads((tmp_path / "scaling.json").read_text())["scaling"]
    assert len(rows) == 2 * len(projection.SYNC_MODES)
    md = (tmp_path / "scaling.md").read_text()
    assert "Overlap rule" in md and "| local_sgd |" in md
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.fixture
def no_planner(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the planner ran before the input was checked")

    monkeypatch.setattr(planner, "run_planner", refuse)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--scale", "0"], ["--scale", "'0'", "positive"]),
        (["--scale", "a"], ["--scale", "'a'", "positive"]),
        (["--scale", "1,,2"], ["--scale", "positive"]),
        (["--scale", "1", "--measured", "/nonexistent/summary.json"], ["--measured", "does not exist", "summary.json"]),
        (["--scale", "1", "--sync-period", "0"], ["--sync-period", "H >= 1"]),
        (["--scale", "1", "topology=cpu"], ["topology.dense_tflops", "--measured"]),
    ],
)
def test_refusals_exit_2_with_one_line(capsys, no_planner, args, words):
    code, out, err = run(
        capsys, *args, *[o for o in TINY if not (o.startswith("topology=") and "topology=cpu" in args)]
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    for w in words:
        assert w in err


def test_corrupt_measured_file(capsys, no_planner, tmp_path):
    path = tmp_path / "summary.json"
    for content in ("{not json", json.dumps({"step_breakdown": {"phase_s": {"backward": "fast"}}}), "[]"):
        path.write_text(content)
        code, _, err = run(capsys, "--scale", "1", "--measured", str(path), *TINY)
        assert code == 2 and err.count("\n") == 1 and "--measured" in err
