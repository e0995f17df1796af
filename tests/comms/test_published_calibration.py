"""Published collective bandwidths (conf/calibration/published.yaml) against dlrm.comms.costmodel.

The file is checked for shape (every figure has a source, a known collective and a topology config that
models the box with that many ranks). The model's busbw for each entry of >= 64 KiB must be within
MAX_ERROR of the published figure (the model is arithmetic on fixed figures: no machine enters);
`pytest -s tests/comms/test_published_calibration.py` prints the table and the geometric-mean error per
system (the way ASTRA-sim reports its validation).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml

from dlrm.comms import load_topology
from dlrm.comms.costmodel import COLLECTIVES, Link, busbw_factor, collective_time, two_level_time
from tests.helpers import REPO_ROOT

PUBLISHED = REPO_ROOT / "conf" / "calibration" / "published.yaml"
MIN_BYTES = 64 * 1024
MAX_ERROR = 0.25  # the cost model's accuracy goal for messages >= 64 KiB
REQUIRED = {
    "id": str,
    "collective": str,
    "system": str,
    "topology": str,
    "nodes": int,
    "ranks": int,
    "message_bytes": int,
    "busbw_GBps": (int, float),
    "algorithm": str,
    "source_url": str,
    "source_title": str,
    "note": str,
}


def load_published(path: Path = PUBLISHED) -> dict:
    data = yaml.safe_load(path.read_text())
    assert data["schema"] == "dlrm.calibration.published/1"
    return data


def model_busbw_GBps(entry: dict) -> float:
    """nccl-tests' busbw that dlrm.comms.costmodel predicts for the entry on its topology config."""
    topo = load_topology(entry["topology"])
    topo = dataclasses.replace(topo, nodes=entry["nodes"])
    g = topo.ranks_per_node
    n, c = entry["message_bytes"], entry["collective"]
    intra, inter = Link.from_config(topo.intra_node), Link.from_config(topo.inter_node)
    if topo.nodes == 1:
        t = collective_time(c, intra, g, n)
    else:
        t = two_level_time(c, intra, inter, topo.nodes, g, n)
    return n / t * busbw_factor(c, topo.nodes * g) / 1e9


def errors() -> list[dict]:
    """One row per entry of >= 64 KiB: measured and modelled busbw, relative error (model / measured - 1)."""
    rows = []
    for e in load_published()["entries"]:
        if e["message_bytes"] < MIN_BYTES:
            continue
        model = model_busbw_GBps(e)
        rows.append(
            {
                "id": e["id"],
                "system": e["system"],
                "ranks": e["ranks"],
                "algorithm": e["algorithm"],
                "published": float(e["busbw_GBps"]),
                "model": model,
                "error": model / e["busbw_GBps"] - 1.0,
            }
        )
    return rows


def test_every_entry_is_sourced_and_consistent_with_its_topology():
    data = load_published()
    entries = data["entries"]
    assert len({e["id"] for e in entries}) == len(entries)
    for e in entries:
        for key, kind in REQUIRED.items():
            assert isinstance(e.get(key), kind), f"{e.get('id')}: {key} missing or not {kind}"
        assert e["collective"] in COLLECTIVES
        assert e["source_url"].startswith("https://")
        assert e["busbw_GBps"] > 0 and e["message_bytes"] > 0
        topo = load_topology(e["topology"])
        assert e["ranks"] == e["nodes"] * topo.ranks_per_node, e["id"]
    # what the cost model is calibrated against: 8-GPU NVSwitch boxes and InfiniBand clusters
    assert any(e["ranks"] == 8 and e["nodes"] == 1 for e in entries)
    assert any(e["nodes"] > 1 for e in entries)
    for ref in data["references"]:
        assert ref["source_url"].startswith("https://") and ref["geomean_error_pct"]


def test_model_is_within_its_goal_of_every_published_figure():
    rows = errors()
    assert rows
    off = {r["id"]: round(100 * r["error"], 1) for r in rows if abs(r["error"]) > MAX_ERROR}
    assert not off, f"model vs published busbw off by more than {MAX_ERROR:.0%} (percent): {off}"
    print(f"\n{'entry':40s} {'ranks':>5s} {'algo':>7s} {'published':>9s} {'model':>7s} {'error':>7s}")
    for r in rows:
        assert math.isfinite(r["model"]) and r["model"] > 0 and math.isfinite(r["error"])
        print(
            f"{r['id']:40s} {r['ranks']:5d} {r['algorithm']:>7s} {r['published']:9.0f} {r['model']:7.0f} "
            f"{100 * r['error']:+6.1f}%"
        )
    by_system: dict = {}
    for r in rows:
        by_system.setdefault((r["ranks"], r["algorithm"] == "nvls"), []).append(abs(r["error"]))
    for (ranks, nvls), errs in sorted(by_system.items()):
        geo = math.exp(sum(math.log(max(x, 1e-12)) for x in errs) / len(errs))
        print(
            f"geomean |error| at {ranks} ranks{' (NVLS)' if nvls else ''}: {100 * geo:.1f}% over {len(errs)} figure(s)"
        )
