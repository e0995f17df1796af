"""dlrm.comms.fit: the least-squares fit recovers a known fabric from noisy timings, refuses too few
points, and writes a topology that loads, composes and drives the cost model."""

import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

import dlrm.config.compose as compose_mod
from dlrm.comms import load_topology
from dlrm.comms.costmodel import CommsError, Link
from dlrm.comms.fit import (
    MIN_SIZES,
    check_sweep,
    fit_points,
    fit_scope,
    fitted_topology,
    level_coefficients,
    topology_yaml,
)
from dlrm.config.compose import CONF_DIR, compose

SIZES = [4096 * 2**k for k in range(11)]  # 4 KiB .. 4 MiB, as the command's default sweep
NOISE = 0.05  # multiplicative, lognormal sigma: a quiet machine's spread of medians


def rows_from(figures: dict[str, tuple[float, float]], noise: float, seed: int = 0, p: int = 2) -> list[dict]:
    """Bench rows (median_us) made from alpha (s) and B (bytes/s) per collective, on Gloo at p ranks."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, (alpha, bw) in figures.items():
        steps, factor = level_coefficients(c, "switch", p, "gloo")
        for n in SIZES:
            t = (steps * alpha + factor * n / bw) * math.exp(rng.normal(0.0, noise))
            rows.append({"collective": c, "scope": "world", "group_size": p, "bytes": n, "median_us": t * 1e6})
    return rows


def test_fit_recovers_alpha_and_beta_from_noisy_timings():
    alpha, bw = 300e-6, 0.5e9
    fit = fit_scope(rows_from({"allreduce": (alpha, bw), "alltoall": (alpha, bw)}, NOISE), "world", "switch", "gloo",
                    0.25, MIN_SIZES)  # fmt: skip
    # 22 points at 5% noise: the estimates' standard errors are ~2%; 10% is five of them
    assert fit.joint.alpha_s == pytest.approx(alpha, rel=0.10)
    assert fit.joint.bandwidth_Bps == pytest.approx(bw, rel=0.10)
    assert fit.joint.max_rel < 4 * NOISE and not fit.per_collective  # one fabric: one link


def test_collectives_that_differ_materially_keep_their_own_figures():
    figures = {"allreduce": (100e-6, 2e9), "alltoall": (400e-6, 0.3e9)}
    fit = fit_scope(rows_from(figures, 0.02, seed=1), "world", "switch", "gloo", 0.25, MIN_SIZES)
    assert fit.per_collective
    for c, (alpha, bw) in figures.items():
        assert fit.own[c].alpha_s == pytest.approx(alpha, rel=0.10)
        assert fit.own[c].bandwidth_Bps == pytest.approx(bw, rel=0.10)


def test_too_few_points_are_refused():
    with pytest.raises(CommsError, match="too few points"):
        fit_points([(1, 0.5, n, 1e-3 + n / 1e9) for n in SIZES[:3]], MIN_SIZES)
    with pytest.raises(CommsError, match="a fit needs at least 4"):
        check_sweep(SIZES[:3], "4K", "16K")


def test_too_few_sizes_refused_in_one_line_before_torchrun():
    run = subprocess.run(
        [sys.executable, "-m", "dlrm.comms.fit", "--min-bytes", "4K", "--max-bytes", "8K"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and run.stderr.startswith("error: ") and "--min-bytes" in run.stderr


def test_written_topology_loads_composes_and_drives_the_model(tmp_path, monkeypatch):
    figures = {"allreduce": (100e-6, 2e9), "alltoall": (400e-6, 0.3e9)}
    fit = fit_scope(rows_from(figures, 0.02, seed=1), "world", "switch", "gloo", 0.25, MIN_SIZES)
    topo = fitted_topology(load_topology("cpu"), "cpu_fit", [fit])
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    path = conf / "topology" / "cpu_fit.yaml"
    path.write_text(topology_yaml(topo, [fit], ["fitted on a test's synthetic timings"]))

    loaded = load_topology(str(path))
    assert loaded == topo and loaded.intra_node.latency_us == pytest.approx(fit.joint.alpha_s * 1e6, abs=0.01)
    monkeypatch.setattr(compose_mod, "CONF_DIR", conf)
    cfg = compose(["topology=cpu_fit"])
    cfg.check()
    assert cfg.topology.name == "cpu_fit" and cfg.topology.intra_node == topo.intra_node
    for c, (alpha, bw) in figures.items():  # each collective's own figures reach the cost model
        link = Link.from_config(cfg.topology.intra_node, c)
        assert link.alpha_s == pytest.approx(alpha, rel=0.10) and link.bandwidth_Bps == pytest.approx(bw, rel=0.10)
    assert Link.from_config(cfg.topology.intra_node).alpha_s == pytest.approx(fit.joint.alpha_s, rel=1e-3)


def test_on_a_shaped_uplink_the_link_is_its_rate_and_each_collective_its_share(tmp_path, monkeypatch):
    """Under dlrm.cluster (DLRM_UPLINK_GBIT set) the inter-node link is written at the uplink's rate per
    rank and every collective's own fit beside it, even one the joint fit would have served, so that
    --gbit at another rate scales each one's share (LinkConfig.rate_overrides)."""
    from dlrm.comms.fit import uplink_GBps_of_env
    from dlrm.config.topology import UPLINK_GBIT_ENV

    rows = [dict(r, scope="inter") for r in rows_from({"allreduce": (0.0, 0.0235e9), "alltoall": (0.0, 0.0119e9)}, 0.0)]
    fit = fit_scope(rows, "inter", "switch", "gloo", 10.0, MIN_SIZES)  # --material too high to split on its own
    assert not fit.per_collective
    monkeypatch.setenv(UPLINK_GBIT_ENV, "0.2")
    uplink = uplink_GBps_of_env(ranks_per_node=1)
    assert uplink == pytest.approx(0.025)
    topo = fitted_topology(load_topology("emu_2x1"), "emu_fit", [fit], uplink)
    path = tmp_path / "emu_fit.yaml"
    path.write_text(topology_yaml(topo, [fit], ["fitted on a test's synthetic timings"]))
    link = load_topology(str(path)).inter_node
    assert link.bandwidth_GBps == pytest.approx(0.025)
    assert link.collectives["allreduce"].bandwidth_GBps == pytest.approx(0.0235, rel=1e-3)
    assert link.collectives["alltoall"].bandwidth_GBps == pytest.approx(0.0119, rel=1e-3)
    scaled = link.rate_overrides("topology.inter_node", 0.05)  # --gbit 0.4
    assert scaled[2] == f"topology.inter_node.collectives.alltoall.bandwidth_GBps={0.0119 * 2!r}"
    monkeypatch.delenv(UPLINK_GBIT_ENV)
    assert uplink_GBps_of_env(1) is None
