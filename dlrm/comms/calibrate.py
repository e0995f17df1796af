"""Calibrate a topology's collectives on profiled training runs: what they reach as the trainer issues them.

    python -m dlrm.comms.calibrate --run outputs/RUN [outputs/RUN2 ...] [--collectives alltoall,allreduce]
                                   [--topology NAME_OR_PATH] [--out FILE]

`dlrm.comms.fit` times each collective alone, every rank entering it together. In training the
messages, their sizes and what else runs differ, and a collective can reach more or less of the link:
on the emulated 2 x 1 cluster the table-wise exchange took x0.86-x0.98 of what the fit predicts.

This command reads profiled runs' `comm_vs_model` (per step, the embedding exchange's and the dense
allreduce's own time, from the last rank's entry to the last exit, beside the model's seconds and
their latency part, `dlrm.comms.measured`) and scales each chosen collective's bandwidth by
(model - latency) / (measured - latency), the median over the runs: the alltoall from the embedding
exchange, the allreduce from the dense allreduce (`--collectives`), latencies kept. With `--term
latency` it scales the latency instead, by (measured - bandwidth terms) / latency, bandwidths kept: for
collectives of small messages, which a busy CPU machine slows by waking its communication threads late
(the one-machine main job: 2 ranks on 2 cores). It changes the link the runs' collectives crossed:
inter_node with several nodes of one rank, intra_node on one node (a run over both levels is refused;
so are runs of different topologies or links). The topology (default: the runs' own, its file in
conf/topology/) is written atomically, its comments kept and the calibration added.
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
    """(summary, config) of a run directory (or its summary.json): CommsError naming what is missing."""
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
    """A comm_vs_model row's seconds (a file's number: checked), CommsError naming it otherwise."""
    value = row.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CommsError(f"comm_vs_model.{name}.{key} = {value!r} is not seconds >= 0; pass an untouched run's summary")
    return float(value)


def link_key(run_topology: dict) -> str:
    """The link a run's collectives crossed: CommsError for a run over both levels."""
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
    """`topo` with link `key`'s bandwidths (or, term="latency", latencies) of `collectives` (alltoall,
    allreduce) scaled to what the runs measured (`runs`: their comm_vs_model; the median factor, module
    docstring), and per collective a line saying what changed; CommsError if none could be."""
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
