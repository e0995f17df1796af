"""dlrm.bench.cluster's pure parts: its options, the order of a round's jobs, reading a run, and the tables,
findings and plot series built from a small fabricated results dict. Plus one smoke run on the emulated
cluster (root only; marked cluster and slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlrm.bench.cluster import experiments as cb
from dlrm.bench.cluster import findings as cbf
from dlrm.bench.cluster import modelled as cbm
from dlrm.bench.cluster import plot as cbp
from dlrm.bench.cluster import summaries as cbr
from dlrm.common.errors import UsageError
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cluster import cannot_build_namespaces


def test_defaults_and_quick_preset(tmp_path):
    opts = cb.parse_args(["--out", str(tmp_path)])
    assert opts.rounds == 3 and opts.gbits == (0.5, 2.0) and opts.variants == tuple(cbr.VARIANTS)
    assert set(opts.variants) >= {"auto", "hierarchical", "local_sgd", *cbr.SHARDING_VARIANTS}
    quick = cb.parse_args(["--quick", "--out", str(tmp_path)])
    assert quick.rounds == 1 and quick.gbits == (1.0,) and quick.steps == 20 and quick.quick
    # Explicit values win over the preset; rates come sorted and unique.
    mixed = cb.parse_args(["--quick", "--rounds", "2", "--gbits", "2,0.5,2", "--variants", "auto,local_sgd"])
    assert mixed.rounds == 2 and mixed.gbits == (0.5, 2.0) and mixed.variants == ("auto", "local_sgd")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--gbits", "0,1"], "--gbits=0.0"),
        (["--gbits", "1,1000"], "from 0.001 to 400 Gbit/s"),
        (["--gbits", "fast"], "--gbits=fast"),
        (["--steps", "30"], "multiple of 4"),
        (["--rounds", "0"], "--rounds=0"),
        (["--variants", "auto,ring"], "choose from"),
        (["--experiments", "train,fun"], "choose from"),
        (["--comms-max-bytes", "1K"], "64K or more"),
        (["--max-minutes", "0"], "--max-minutes=0"),
        (["--shape", "1x1"], "--shape=1x1"),
        (["--shape", "2x3"], "2 to 4 nodes of 1 or 2 ranks"),
        (["--shape", "two"], "--shape=two"),
    ],
)
def test_bad_options_are_refused(args, says):
    with pytest.raises(UsageError, match=says.replace("(", r"\(")):
        cb.parse_args(args)


def test_a_round_interleaves_every_job_and_rotates():
    opts = cb.Options(gbits=(0.5, 2.0), variants=("auto", "hierarchical"))
    first, second = cb.round_specs(opts, 0), cb.round_specs(opts, 1)
    comms = [s for s in first if s.kind == "comms"]
    assert [s.gbit for s in comms] == [0.5, 2.0] and not [s for s in second if s.kind == "comms"]
    jobs = [s for s in first if s.kind == "train"]
    assert sorted(map(str, jobs)) == sorted(map(str, second))  # the same jobs, another order
    assert second[-1] == jobs[0]  # rotated by one
    names = {s.name for s in jobs}
    assert {"train-1x1-local-auto", "train-1x2-local-auto", "train-2x2-0.5g-hierarchical", "train-4x1-2g-auto"} <= names
    assert len(names) == len(jobs) == 2 + 2 * (2 + 2)  # calibrations, then per rate: 2 variants, 2x1, 4x1
    # Without the train experiment, scale still runs its own 2 x 2 point.
    scale = cb.round_specs(cb.Options(gbits=(1.0,), experiments=("scale",)), 0)
    assert {s.name for s in scale} == {
        "train-1x1-local-auto",
        "train-1x2-local-auto",
        "train-2x1-1g-auto",
        "train-4x1-1g-auto",
        "train-2x2-1g-auto",
    }


def test_another_shape_trains_there_and_calibrates_on_one_node_of_it(tmp_path):
    args = ["--shape", "2x1", "--gbits", "0.05,0.5", "--variants", "auto,data_parallel", "--experiments", "train,scale"]
    opts = cb.parse_args([*args, "--out", str(tmp_path)])
    assert opts.shape == (2, 1) and "data_parallel" in cbr.SHARDING_VARIANTS
    names = {s.name for s in cb.round_specs(opts, 0)}
    assert names == {"train-1x1-local-auto"} | {f"train-2x1-{g}g-{v}" for g in ("0.05", "0.5") for v in opts.variants}
    cmd = cb.cluster_command(opts, cb.Spec("train", 2, 1, 0.05, "data_parallel"), tmp_path)
    assert {"topology=emu_2x1", "topology.nodes=2", "sharding=data_parallel", "--gbit"} <= set(cmd)  # its own fit
    assert "topology=emu_4x1" in cb.cluster_command(opts, cb.Spec("train", 1, 1, None, "auto"), tmp_path)
    overrides, counts = cbm.plan_overrides("dlrm_wide", 512, 0.05, "1x1", opts.shape)
    assert "topology=emu_2x1" in overrides and counts == "1,2"  # projected on the 2 x 1 fit
    assert cbm.plan_overrides("dlrm_wide", 512, 0.05, "1x1")[1] == "1,2,4"  # the default shape: 2 x 1 and 4 x 1
    # The tables, findings and plot follow the results' shape.
    results = fabricated()
    results["options"]["shape"] = [2, 1]
    runs = [r for r in results["runs"] if r.get("nodes") == 2 and r["ranks_per_node"] == 1]
    results["runs"] += [{**r, "variant": "data_parallel", "step_s": r["step_s"] * 0.98} for r in runs]
    train = cbr.train_table(results)
    assert "variant (2 x 1)" in train and "| 0.5 | auto | 2 | 60.0 (60.0-60.0) | 1.00 | 80.0 |" in train
    assert "| 0.5 | data_parallel | 2 | 58.8 (58.8-58.8) | 0.98 |" in train
    found = "\n".join(cbf.findings(results))
    assert "(2 x 1, the planner's plan)" in found and "measured fastest: data_parallel" in found
    assert "+2% (goal within 5%: met)" in found
    md = cbf.findings_md(results)
    assert "## Training on 2 nodes x 1 rank(s)" in md and "4 ranks share 2 cores" in md
    assert "2 nodes x 1 rank(s): step time vs uplink" not in md  # the plot's title, not the page's
    assert {"auto (measured)", "data_parallel (measured)"} <= {
        s.label for s in cbp.plot_series(results) if s.panel == 0
    }


def test_commands_size_the_job_for_weak_scaling(tmp_path):
    opts = cb.Options(batch_per_rank=128, steps=24)
    spec = cb.Spec("train", 4, 1, 0.5, "local_sgd")
    cmd = cb.cluster_command(opts, spec, tmp_path)
    i = cmd.index("--")
    assert cmd[:i][-6:] == ["--nodes", "4", "--ranks-per-node", "1", "--gbit", "0.5"]
    assert {"topology=emu_4x1", "topology.nodes=4", "data.global_batch_size=512", "trainer.max_steps=24"} <= set(cmd)
    assert {"trainer.dense_sync=local_sgd", "trainer.sync_period=4", f"hydra.run.dir={tmp_path}"} <= set(cmd)
    local = cb.cluster_command(opts, cb.Spec("train", 1, 2, None, "auto"), tmp_path)
    assert "--gbit" not in local and "topology=emu_2x2" in local and "topology.nodes=1" in local
    bench = cb.cluster_command(opts, cb.Spec("comms", 2, 2, 2.0, "bench"), tmp_path)
    assert bench[bench.index("--module") + 1] == "dlrm.comms.measure" and "world,intra,inter" in bench


def test_another_uplink_rate_scales_each_collectives_own_fit_alike():
    """--gbit G sets the trainer's inter-node link to G/8/R GB/s; a collective fitted apart
    (LinkConfig.collectives: Gloo's 2-rank alltoall at about half the link) keeps its share of it,
    and the cost model and the planner then read the composed figures."""
    from dlrm.cluster.emulator import plan_job
    from dlrm.comms.costmodel import Link
    from dlrm.config import CollectiveLinkConfig, LinkConfig
    from dlrm.config.compose import compose

    link = LinkConfig(bandwidth_GBps=0.0625, collectives={"alltoall": CollectiveLinkConfig(0.03125, 100.0)})
    assert link.rate_overrides("topology.inter_node", 0.25) == [
        "topology.inter_node.bandwidth_GBps=0.25",
        "topology.inter_node.collectives.alltoall.bandwidth_GBps=0.125",
    ]
    fitted = compose(["topology=emu_2x1"]).topology.inter_node
    job = plan_job(2, 1, 0.1, ["topology=emu_2x1", "model=tiny", "data.global_batch_size=64"])
    topo = compose(job.overrides).topology
    assert topo.inter_node.bandwidth_GBps == pytest.approx(0.1 / 8)
    for name, own in fitted.collectives.items():  # emu_2x1's shipped fit has its alltoall apart
        share = own.bandwidth_GBps / fitted.bandwidth_GBps
        assert Link.from_config(topo.inter_node, name).bandwidth_Bps == pytest.approx(0.1 / 8 * share * 1e9)
    assert "alltoall" in fitted.collectives


def test_a_training_run_is_read_from_its_summary_and_metrics(tmp_path):
    phases = {"input_dist": 0.002, "emb_a2a_fwd": 0.01, "grad_a2a": 0.008, "dense_allreduce": 0.01, "backward": 0.01}
    summary = {
        "step_breakdown": {"phase_s": phases},
        "comm_vs_model": {
            "embedding_exchange": {"measured_s": 0.02, "model_s": 0.01, "ratio": 2.0},
            "dense_allreduce": {"measured_s": 0.012, "model_s": 0.004, "ratio": 3.0},
            "model": "topology config",
        },
        "sharding_plan": [{"sharding_type": "table_wise"}] * 3 + [{"sharding_type": "row_wise"}],
        "train_samples_per_s": 1000.0,
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    windows = [{"event": "start", "step": 0}, {"step": 10, "step_s": 0.9}]
    for i, step_s in ((2, 0.04), (3, 0.05), (4, 0.07)):
        windows.append({"step": 10 * i, "step_s": step_s, "profile_overhead_s": 0.03, "profiled_steps": 1})
    windows.append({"step": 40, "eval_auc": 0.7})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(w) for w in windows) + "\n")
    rec = cbr.train_record(tmp_path)
    # The first window (warm-up) left out; the profiler's overhead is off the trainer's clock already.
    assert rec["step_s"] == pytest.approx(0.05) and rec["step_with_profiler_s"] == pytest.approx(0.05)
    assert rec["a2a_share"] == pytest.approx(0.02 / 0.04) and rec["allreduce_share"] == pytest.approx(0.25)
    assert rec["comm_measured_s"] == {"embedding_exchange": 0.02, "dense_allreduce": 0.012}
    assert rec["plan_types"] == {"table_wise": 3, "row_wise": 1}
    assert cbr.comm_ratio(rec, "dense_allreduce") == pytest.approx(3.0)


def _run(variant, nodes, rpn, gbit, step_s, a2a, ar=0.2, rnd=0, plan=None):
    return {
        "kind": "train", "variant": variant, "nodes": nodes, "ranks_per_node": rpn, "gbit": gbit, "round": rnd,
        "ok": True, "name": f"train-{nodes}x{rpn}-{gbit}-{variant}", "step_s": step_s, "a2a_share": a2a,
        "allreduce_share": ar, "comm_measured_s": {"embedding_exchange": 0.03, "dense_allreduce": 0.02},
        "comm_model_s": {"embedding_exchange": 0.01, "dense_allreduce": 0.02},
        "plan_types": plan or {"table_wise": 26},
    }  # fmt: skip


def _projection(gbit, series, nodes, sync, step_s, a2a):
    return {"round": 0, "gbit": gbit, "series": series, "nodes": nodes, "dense_sync": sync, "step_s": step_s,
            "a2a_share": a2a, "allreduce_share": 0.1}  # fmt: skip


def fabricated() -> dict:
    """Two rates, two rounds of 2 x 2 variants, the scaling runs and projections, a few comms rows."""
    runs = []
    for rnd in (0, 1):
        runs += [_run("auto", 1, 1, None, 0.015, 0.1, 0.0, rnd), _run("auto", 1, 2, None, 0.03, 0.3, 0.1, rnd)]
        for g, slow in ((0.5, 2.0), (2.0, 1.0)):
            runs += [
                _run("auto", 2, 2, g, 0.05 * slow, 0.3 * slow, rnd=rnd),
                _run("hierarchical", 2, 2, g, 0.045 * slow, 0.3 * slow, 0.1, rnd),
                _run("local_sgd", 2, 2, g, 0.04 * slow, 0.3 * slow, 0.02, rnd),
                _run("row_wise", 2, 2, g, 0.06 * slow, 0.4 * slow, rnd=rnd),
                _run("auto", 2, 1, g, 0.03 * slow, 0.2 * slow, rnd=rnd),
                _run("auto", 4, 1, g, 0.04 * slow, 0.3 * slow, rnd=rnd),
            ]
    runs.append({"kind": "train", "variant": "column_wise", "nodes": 2, "ranks_per_node": 2, "gbit": 2.0, "round": 1,
                 "ok": False, "name": "train-2x2-2g-column_wise", "error": "agent failed"})  # fmt: skip
    projections = []
    for g, slow in ((0.5, 2.0), (2.0, 1.0)):
        for sync, f in (("allreduce", 1.0), ("hierarchical", 0.9), ("local_sgd", 0.8)):
            projections.append(_projection(g, "1x2", 2, sync, 0.05 * slow * f, 0.25 * slow))
        for n in (1, 2, 4):
            projections.append(_projection(g, "1x1", n, "allreduce", 0.02 * n * slow, 0.2 * slow))
    inter = {"gbit": 1.0, "scope": "inter", "group_size": 2}
    comms = [
        {**inter, "collective": "allreduce", "bytes": n, "measured_s": t, "model_s": t * r}
        for n, t, r in ((32768, 1e-3, 5.0), (65536, 1e-3, 1.1), (1 << 20, 1e-2, 0.9))
    ] + [{**inter, "collective": "reduce_scatter", "bytes": 1 << 20, "measured_s": 2e-2, "model_s": 1e-2}]
    return {"schema": cb.SCHEMA, "runs": runs, "projections": projections, "comms": comms, "rounds_done": 2,
            "options": {"model": "dlrm_small", "batch_per_rank": 256, "steps": 60},
            "machine": {"cpus": 2, "cpu_model": "test cpu"}, "started": "then", "ended": "now"}  # fmt: skip


def test_findings_and_tables_from_a_results_dict():
    results = fabricated()
    md = cbf.findings_md(results)
    assert md.startswith("# ") and "2 cores (test cpu)" in md and "2 interleaved round(s)" in md
    train = cbr.train_table(results)
    assert (
        "| 0.5 | auto | 2 | 100.0 (100.0-100.0) | 1.00 | 100.0 | 60% | 50% | 20% | x3.00 | x1.00 | table_wise 26 |"
        in train
    )
    assert "| 2 | hierarchical | 2 | 45.0 (45.0-45.0) | 0.90 | 45.0 |" in train
    scale = cbr.scale_table(results)
    assert "| 1 | 4 | 0.5 | 80.0 (80.0-80.0) | 160.0 | +100% |" in scale  # model 2x measured
    assert "| 2 | 2 | 2 | 50.0 (50.0-50.0) | 50.0 | +0% |" in scale
    comms = cbr.comms_table(results)
    # 32 KiB is left out (< 64 KiB): geomean of 10% and 10% for allreduce; reduce-scatter 50% off.
    assert "| 1 | allreduce | inter | 10% | x1.00 | met |" in comms
    assert "| 1 | reduce_scatter | inter | 50% | x0.50 | missed |" in comms
    found = "\n".join(cbf.findings(results))
    assert "from 2 to 0.5 Gbit/s" in found and "from 30% to 60% of the step (modelled 25% to 50%)" in found
    assert "Hierarchical allreduce" in found and "Verdict per rate: pays, pays" in found
    assert "Local SGD (H=4)" in found and "0.80x the flat allreduce's step time, modelled 0.80x" in found
    assert "measured fastest: auto" in found and "+0% (goal within 5%: met)" in found
    assert "comm_vs_model embedding_exchange" in found and "median x3.00" in found and "0 of 26 within 1.25x" in found
    assert "1 of 2 (rate, collective, scope) cells within 25%" in found
    assert "## Failed runs" in md and "train-2x2-2g-column_wise (round 2): agent failed" in md


def test_plot_series_tell_measured_from_modelled():
    series = cbp.plot_series(fabricated())
    for panel in (0, 1, 2):
        labels = [s.label for s in series if s.panel == panel]
        assert labels and len(labels) == len(set(labels)), labels
    for s in series:
        assert s.label.endswith(" (measured)") == s.measured and s.label.endswith(" (modelled)") == (not s.measured)
        assert len(s.x) == len(s.y) >= 1
    panel0 = {s.label for s in series if s.panel == 0}
    assert {"auto (measured)", "hierarchical (measured)", "local_sgd (measured)", "row_wise (measured)"} <= panel0
    assert {"auto (modelled)", "hierarchical (modelled)", "local_sgd (modelled)"} <= panel0
    nodes = [s for s in series if s.panel == 1]
    assert {s.label for s in nodes} == {f"{g} Gbit/s ({m})" for g in ("0.5", "2") for m in ("measured", "modelled")}
    assert all(s.x == [1, 2, 4] for s in nodes)
    assert {"4 x 1, auto (measured)", "2 x 2, auto (modelled)"} <= {s.label for s in series if s.panel == 2}
    png = cbp.plot(fabricated())
    assert png.startswith(b"\x89PNG")


def test_render_rewrites_the_findings(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(fabricated()))
    assert cb.main(["--render", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "findings.md").read_text().startswith("# ")
    assert (tmp_path / "findings.png").read_bytes().startswith(b"\x89PNG")
    assert cb.main(["--render", "--out", str(tmp_path / "none")]) == 2
    assert "--render: cannot read" in capsys.readouterr().err


def test_render_remodels_the_collectives_and_keeps_the_runs_own_figures():

    results = fabricated()
    n = 4 * 2**20
    results["comms"].append({"gbit": 0.5, "scope": "world", "group_size": 4, "collective": "reduce_scatter",
                             "bytes": n, "measured_s": 0.1132, "model_s": 0.0362})  # fmt: skip
    done = cbm.remodel(results)
    row = results["comms"][-1]
    assert row["model_s_at_run"] == 0.0362
    # emu_2x2 is Gloo: its reduce-scatter over both nodes is one flat ring allreduce, 1.5 n through each
    # node's 0.5 Gbit/s uplink (its 2 ranks' share), 6 steps at the larger latency
    from dlrm.comms.costmodel import Link

    topo = cbm.emulated_topology(0.5, 2, 2)
    intra, inter = (Link.from_config(level, "reduce_scatter") for level in (topo.intra_node, topo.inter_node))
    assert 2 * inter.bandwidth_Bps == pytest.approx(62.5e6)  # no fit of its own: the uplink's 0.5 Gbit/s
    rate = min(intra.bandwidth_Bps, 2 * inter.bandwidth_Bps)
    assert row["model_s"] == pytest.approx(6 * max(intra.alpha_s, inter.alpha_s) + 1.5 * n / rate)
    assert done["comms_rows"] == len(results["comms"]) and done["projections"] == 0  # no calibration runs kept
    assert done["comm_vs_model_runs"] == 0 and results["projections"]  # the stored projections stay
    assert "re-evaluated on" in cbf.findings_md(results)


def test_a_runs_tables_from_its_summarys_plan():
    from types import SimpleNamespace

    from dlrm.bench.cluster.modelled import tables_from_summary

    kinds = {"t0": ("table_wise", [2]), "t1": ("row_wise", [0, 1, 2]), "t2": ("column_wise", [0, 1]),
             "t3": ("table_row_wise", [2, 3]), "t4": ("data_parallel", [])}  # fmt: skip
    model = SimpleNamespace(
        tables=[SimpleNamespace(name=k, rows=2000, dim=16, features=["a"], pooling=2) for k in kinds]
    )
    plan = [{"table": k, "sharding_type": t, "ranks": r, "compute_kernel": "fused"} for k, (t, r) in kinds.items()]
    got = {t.table: t for t in tables_from_summary({"sharding_plan": plan, "world_size": 4}, model)}
    blocks = {k: [(s.rank, s.row_offset, s.col_offset, s.rows, s.cols) for s in t.shards] for k, t in got.items()}
    assert blocks["t0"] == [(2, 0, 0, 2000, 16)]
    assert blocks["t1"] == [(0, 0, 0, 667, 16), (1, 667, 0, 667, 16), (2, 1334, 0, 666, 16)]  # ceil(2000 / 3)
    assert blocks["t2"] == [(0, 0, 0, 2000, 8), (1, 0, 8, 2000, 8)]
    assert blocks["t3"] == [(2, 0, 0, 1000, 16), (3, 1000, 0, 1000, 16)]
    assert [b[0] for b in blocks["t4"]] == [0, 1, 2, 3] and got["t4"].ranks == [0, 1, 2, 3]
    assert got["t1"].features == 1 and got["t1"].pooling == 2 and got["t1"].sharding_type == "row_wise"


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.long  # ~30 s: the fabric itself is covered by tests/cluster/test_emulated.py in the default run
@pytest.mark.skipif(bool(reason := cannot_build_namespaces()), reason=reason or "")
def test_smoke_one_training_run_on_the_emulated_cluster(tmp_path):
    """One 2 x 2 run at 1 Gbit/s through the whole command: results, findings and plot written."""
    cmd = [sys.executable, "-m", "dlrm.bench.cluster", "--quick", "--experiments", "train", "--variants", "auto",
           "--steps", "12", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    results = json.loads((tmp_path / "results.json").read_text())
    (run,) = results["runs"]
    assert run["ok"] and run["name"] == "train-2x2-1g-auto" and run["step_s"] > 0
    assert "| 1 | auto | 1 |" in (tmp_path / "findings.md").read_text()
    assert (tmp_path / "findings.png").read_bytes().startswith(b"\x89PNG")
