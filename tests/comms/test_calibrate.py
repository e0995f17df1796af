"""dlrm.comms.calibrate: a collective's bandwidth scaled to what a training run measured, latency kept;
runs it cannot use are refused in one line."""

import json
import subprocess
import sys

import pytest

from dlrm.comms import load_topology
from dlrm.comms.calibrate import calibrated, link_key, main
from dlrm.comms.costmodel import CommsError, Link
from dlrm.config import CollectiveLinkConfig, LinkConfig, TopologyConfig


def row(measured_s: float, model_s: float, latency_s: float = 0.0, compared: bool = True) -> dict:
    return {"measured_s": measured_s, "model_s": model_s, "model_latency_s": latency_s, "compared": compared}


def test_the_bandwidth_term_is_scaled_to_the_measured_transfer_and_the_latency_stays():
    link = LinkConfig(bandwidth_GBps=1.0, latency_us=100.0, collectives={"allreduce": CollectiveLinkConfig(0.8, 50.0)})
    topo = TopologyConfig(intra_node=link)
    # exchange: 5 ms modelled of which 1 ms latency, 9 ms measured: the bytes took 8 ms, not 4: half the bandwidth
    versus = {"embedding_exchange": row(0.009, 0.005, 0.001), "dense_allreduce": row(0.002, 0.003, 0.001)}
    out, said = calibrated(topo, "intra_node", [versus])
    assert Link.from_config(out.intra_node, "alltoall").bandwidth_Bps == pytest.approx(0.5e9)
    assert Link.from_config(out.intra_node, "alltoall").alpha_s == pytest.approx(100e-6)  # the link's, kept
    assert out.intra_node.collectives["allreduce"] == CollectiveLinkConfig(1.6, 50.0)  # 2 ms modelled, 1 measured
    assert out.intra_node.bandwidth_GBps == 1.0 and out.inter_node == topo.inter_node
    assert said["alltoall"].startswith("calibrated: embedding_exchange measured 9.0 ms against 5.0 ms (x1.80)")
    only, said = calibrated(topo, "intra_node", [versus], ["alltoall"])
    assert only.intra_node.collectives["allreduce"] == link.collectives["allreduce"] and set(said) == {"alltoall"}


def test_rows_it_cannot_use_are_said_and_none_at_all_is_refused():
    topo = TopologyConfig()
    versus = {
        "embedding_exchange": {**row(0.0, 0.0, compared=False), "why": "the model sends nothing for this plan"},
        "dense_allreduce": row(0.0005, 0.002, 0.001),  # measured below the latency terms
    }
    with pytest.raises(CommsError, match="nothing to calibrate: not calibrated: embedding_exchange was not compared"):
        calibrated(topo, "intra_node", [versus])
    with pytest.raises(CommsError, match="both links"):
        link_key({"nodes": 2, "ranks_per_node": 2})
    assert link_key({"nodes": 2, "ranks_per_node": 1}) == "inter_node" and link_key({"nodes": 1}) == "intra_node"


def test_several_runs_give_the_median_factor():
    topo = TopologyConfig(intra_node=LinkConfig(bandwidth_GBps=1.0, latency_us=0.0))
    runs = [{"embedding_exchange": row(m, 0.010)} for m in (0.020, 0.008, 0.010)]  # factors 0.5, 1.25, 1
    out, said = calibrated(topo, "intra_node", runs, ["alltoall"])
    assert out.intra_node.collectives["alltoall"].bandwidth_GBps == pytest.approx(1.0)
    assert "the median factor 1.000 of 3 runs" in said["alltoall"]


def test_the_latency_term_takes_what_the_bandwidth_term_leaves():
    link = LinkConfig(bandwidth_GBps=1.0, latency_us=100.0)
    topo = TopologyConfig(intra_node=link)
    # 5 ms modelled of which 1 ms latency: the bytes' 4 ms kept, the latency terms take 9 - 4 = 5 ms, 5x
    versus = {"embedding_exchange": row(0.009, 0.005, 0.001), "dense_allreduce": row(0.002, 0.003, 0.0)}
    out, said = calibrated(topo, "intra_node", [versus], term="latency")
    assert out.intra_node.collectives["alltoall"] == CollectiveLinkConfig(1.0, 500.0)
    assert "latency 100 -> 500 us" in said["alltoall"]
    assert "allreduce" not in out.intra_node.collectives and "no latency terms" in said["allreduce"]


def fake_run(tmp_path, versus: dict, nodes: int = 2, ranks: int = 1, name: str = "run", topology: str = "emu_2x1"):
    run = tmp_path / name
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"topology": topology, "comm_vs_model": versus}))
    (run / "config.yaml").write_text(f"topology:\n  name: {topology}\n  nodes: {nodes}\n  ranks_per_node: {ranks}\n")
    return run


def test_the_command_writes_a_topology_that_loads_and_keeps_the_fits_comments(tmp_path):
    run = fake_run(tmp_path, {"embedding_exchange": row(0.2, 0.3), "dense_allreduce": row(0.05, 0.02)})
    out = tmp_path / "emu_cal.yaml"
    before = load_topology("emu_2x1")
    topo = main(["--run", str(run), "--collectives", "alltoall", "--out", str(out)])
    loaded = load_topology(str(out))
    assert loaded == topo
    a2a = before.inter_node.collectives.get("alltoall", before.inter_node)
    assert loaded.inter_node.collectives["alltoall"].bandwidth_GBps == pytest.approx(a2a.bandwidth_GBps * 1.5, rel=1e-3)
    assert loaded.inter_node.collectives.get("allreduce") == before.inter_node.collectives.get("allreduce")
    text = out.read_text()
    assert "# emu_2x1: 2 node(s) x 1 ranks" in text and "Calibrated" in text  # the fit's header, then this


@pytest.mark.parametrize(
    ("args", "versus", "says"),
    [
        (["--run", "nowhere"], None, "nowhere does not exist"),
        (["--collectives", "broadcast"], None, "--collectives=broadcast"),
        ([], {"embedding_exchange": {**row(0.2, 0.3), "model_s": "fast"}}, "model_s = 'fast' is not seconds"),
        ([], {"embedding_exchange": {**row(0.2, 0.3), "measured_s": float("nan")}}, "measured_s = nan"),
        (["other"], None, "the runs used topologies ['emu_2x1', 'emu_4x1']"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, versus, says):
    run = fake_run(tmp_path, versus or {"embedding_exchange": row(0.2, 0.3)})
    if args == ["other"]:  # with a second run, of another topology (the last --run given counts)
        other = fake_run(tmp_path, {"embedding_exchange": row(0.2, 0.3)}, name="other", topology="emu_4x1")
        args = ["--run", str(run), str(other)]
    argv = [sys.executable, "-m", "dlrm.comms.calibrate", "--run", str(run), "--out", str(tmp_path / "t.yaml"), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (tmp_path / "t.yaml").exists()
