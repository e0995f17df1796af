"""Calibrate a topology's collectives on profiled training runs.

    python -m dlrm.comms.calibrate --run outputs/RUN [outputs/RUN2 ...] [--collectives alltoall,allreduce]
                                   [--term bandwidth|latency] [--topology NAME_OR_PATH] [--out FILE]

Each run's summary holds `comm_vs_model`: per step, the embedding exchange's and the dense allreduce's
measured seconds beside the model's. Each chosen collective's bandwidth is scaled by
(model - latency) / (measured - latency), the median over the runs (alltoall from the embedding
exchange, allreduce from the dense allreduce); with `--term latency` the latency is scaled instead, by
(measured - bandwidth terms) / latency. The link changed is the one the runs crossed: inter_node for
several nodes of one rank, intra_node for one node. The topology (default: the runs' own) is written
atomically, its comments kept and the calibration added.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dlrm.common.errors import ArgumentParser, run_rank_command
from dlrm.common.io import JSON_LIMIT, UnreadableFileError, parse_json, read_bounded, write_atomic
from dlrm.comms import load_topology
from dlrm.comms.costmodel import CommsError
from dlrm.comms.fit import output_path, topology_yaml
from dlrm.config import CollectiveLinkConfig, TopologyConfig

ROWS = {"embedding_exchange": "alltoall", "dense_allreduce": "allreduce"}  # comm_vs_model row -> collective


def read_run(run: str) -> tuple[dict, dict]:
    """Read a finished training run.

    Args:
        run: the run's directory, or its summary.json.

    Returns:
        (summary, config) as plain dicts.

    Raises:
        CommsError: the summary is missing, unreadable or has no comm_vs_model, or the config has no topology.
    """
    path = Path(run)
    summary_path = path / "summary.json" if path.is_dir() else path
    config_path = summary_path.parent / "config.yaml"
    if not summary_path.is_file():
        raise CommsError(f"{summary_path} does not exist; pass a training run's directory (it holds summary.json)")
    try:
        summary = parse_json(read_bounded(summary_path, JSON_LIMIT))
    except (OSError, ValueError, UnreadableFileError) as e:
        raise CommsError(f"{summary_path}: not a readable JSON summary ({e}); pass a finished run's folder") from None
    versus = summary.get("comm_vs_model") if isinstance(summary, dict) else None
    if not isinstance(versus, dict):
        raise CommsError(
            f"{summary_path} has no comm_vs_model: train with trainer.breakdown=true (the default) and let the run end"
        )
    from dlrm.run.records import read_config

    config = read_config(summary_path.parent)  # plain data, bounded; ConfigError (one line) if unreadable
    if config is None or not isinstance(config.get("topology"), dict):
        raise CommsError(f"{config_path} has no topology section; pass a dlrm.train run's directory")
    return summary, config


def _seconds(row: dict, key: str, name: str) -> float:
    """A comm_vs_model row's seconds under `key`, checked; CommsError naming it otherwise."""
    value = row.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CommsError(f"comm_vs_model.{name}.{key} = {value!r} is not seconds >= 0; pass an untouched run's summary")
    return float(value)


def link_key(run_topology: dict) -> str:
    """The link ('intra_node' or 'inter_node') a run's collectives crossed.

    Raises:
        CommsError: the run spans several nodes of several ranks, so both links were crossed.
    """
    nodes, ranks = int(run_topology.get("nodes", 1)), run_topology.get("ranks_per_node")
    if nodes > 1 and ranks not in (None, 1):
        raise CommsError(
            f"the run spans {nodes} nodes of {ranks} ranks: its collectives crossed both links and cannot be told "
            "apart; calibrate on a run of one node, or of one rank per node"
        )
    return "inter_node" if nodes > 1 else "intra_node"


def calibrated(
    topo: TopologyConfig,
    key: str,
    runs: Sequence[dict],
    collectives: Sequence[str] = tuple(ROWS.values()),
    term: str = "bandwidth",
) -> tuple[TopologyConfig, dict[str, str]]:
    """Scale one link's figures of `collectives` to what the runs measured.

    Args:
        topo: the topology to calibrate.
        key: the link, 'intra_node' or 'inter_node'.
        runs: each run's comm_vs_model.
        collectives: which of 'alltoall', 'allreduce' to calibrate.
        term: 'bandwidth' (scale bandwidth_GBps) or 'latency' (scale latency_us).

    Returns:
        (the calibrated topology, per collective a line saying what changed or why not).

    Raises:
        CommsError: no collective could be calibrated.
    """
    link = getattr(topo, key)
    own = dict(link.collectives)
    said: dict[str, str] = {}
    for row, collective in ROWS.items():
        if collective not in collectives:
            continue
        factors, seen, why = [], [], ""
        for versus in runs:
            r = versus.get(row)
            if not isinstance(r, dict) or not r.get("compared"):
                reason = r.get("why", "not measured") if isinstance(r, dict) else "not in the run"
                why = f"{row} was not compared ({reason})"
                continue
            latency = _seconds(r, "model_latency_s", row)
            modelled, measured = _seconds(r, "model_s", row) - latency, _seconds(r, "measured_s", row) - latency
            if term == "latency":  # the bandwidth terms kept, the latency terms take the rest
                if latency <= 0 or measured + latency - modelled <= 0:
                    why = f"{row}'s time is within its bandwidth terms, or the model has no latency terms"
                    continue
                factors.append((measured + latency - modelled) / latency)
            elif modelled <= 0 or measured <= 0:
                why = f"{row}'s time is within its latency terms"
                continue
            else:
                factors.append(modelled / measured)
            ms, model_ms = r["measured_s"] * 1e3, r["model_s"] * 1e3
            seen.append(f"{ms:.1f} ms against {model_ms:.1f} ms (x{ms / model_ms:.2f})")
        if not factors:
            said[collective] = f"not calibrated: {why}"
            continue
        before = own.get(collective, CollectiveLinkConfig(link.bandwidth_GBps, link.latency_us))
        factor = statistics.median(factors)
        if term == "latency":
            own[collective] = replace(before, latency_us=float(f"{before.latency_us * factor:.4g}"))
            change = f"latency {before.latency_us:.4g} -> {own[collective].latency_us:.4g} us"
        else:
            own[collective] = replace(before, bandwidth_GBps=float(f"{before.bandwidth_GBps * factor:.4g}"))
            change = f"{before.bandwidth_GBps:.4g} -> {own[collective].bandwidth_GBps:.4g} GB/s"
        said[collective] = (
            f"calibrated: {row} measured {'; '.join(seen)}"
            + (f": the median factor {factor:.3f} of {len(factors)} runs" if len(factors) > 1 else "")
            + f", so {change}"
        )
    if not any(line.startswith("calibrated") for line in said.values()):
        raise CommsError("nothing to calibrate: " + "; ".join(said.values()))
    return replace(topo, **{key: replace(link, collectives=own, placeholder=False)}), said


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgumentParser(prog="python -m dlrm.comms.calibrate", description="Calibrate a topology on a training run.")
    ap.add_argument(
        "--run", required=True, nargs="+", help="profiled training runs' directories (summary.json, config.yaml)"
    )
    ap.add_argument(
        "--collectives", default="alltoall,allreduce", help="comma list of alltoall (the embedding exchange), allreduce"
    )
    ap.add_argument(
        "--term",
        default="bandwidth",
        choices=("bandwidth", "latency"),
        help="the term scaled: bandwidth (bulk messages), or latency (collectives that small messages make "
        "latency-bound, as on one CPU machine)",
    )
    ap.add_argument("--topology", help="topology to calibrate, a name or YAML path (default: the run's)")
    ap.add_argument("--out", help="YAML file to write (default conf/topology/NAME.yaml)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> TopologyConfig:
    """Calibrate and write the topology; returns the calibrated topology."""
    args = parse_args(argv)
    collectives = [c for c in args.collectives.split(",") if c]
    unknown = sorted(set(collectives) - set(ROWS.values()))
    if unknown or not collectives:
        raise CommsError(f"--collectives={args.collectives}: give a comma list of {', '.join(ROWS.values())}")
    read = [read_run(run) for run in args.run]
    names = {str(config["topology"].get("name") or summary.get("topology")) for summary, config in read}
    keys = {link_key(config["topology"]) for _, config in read}
    if len(names) > 1 or len(keys) > 1:
        raise CommsError(
            f"the runs used topologies {sorted(names)} over links {sorted(keys)}: calibrate on runs of one topology "
            "and link"
        )
    name = args.topology or names.pop()
    try:
        topo = load_topology(name)
    except FileNotFoundError as e:
        raise CommsError(str(e)) from None
    key = keys.pop()
    before = getattr(topo, key).collectives
    topo, said = calibrated(topo, key, [summary["comm_vs_model"] for summary, _ in read], collectives, args.term)
    changed = {c for c, own in getattr(topo, key).collectives.items() if before.get(c) != own}
    source = Path(name) if Path(name).suffix else output_path(name, None)
    kept = [line[2:] for line in source.read_text().splitlines() if line.startswith("# ")] if source.is_file() else []
    command = "python -m dlrm.comms.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])
    header = [*kept, f"Calibrated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}`:"]
    header += [f"- {collective}: {line}" for collective, line in said.items()]
    notes = {f"{key}.{c}": "calibrated on a training run (header)" for c, line in said.items() if c in changed}
    notes[f"{key}.collectives"] = "each one's own figures: fitted, then calibrated as the header says"
    notes[key] = "fitted, then calibrated on a training run (the header)"
    out = Path(args.out) if args.out else output_path(topo.name, None)
    write_atomic(out, topology_yaml(topo, [], header, notes).encode())
    load_topology(str(out))  # what was written reads back as a topology
    for line in header[len(kept) :]:
        print(line)
    print(f"wrote {out}")
    return topo


if __name__ == "__main__":
    run_rank_command(main, CommsError)
