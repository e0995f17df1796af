"""The planner's scaling projection command.

python -m dlrm.plan ... --scale 1,2,4 [--sync-period H] [--measured summary.json] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from dlrm.config.compose import compose
from dlrm.plan.projection import CALIBRATION, OVERLAP_RULE, PLANNING, load_measured, parse_scale, scaling
from dlrm.plan.scaling_report import markdown, write


def scaling_main(args: argparse.Namespace, overrides: list[str]) -> int:
    """Check the flags, plan one node, project every node count; print (and with --out write) the report."""
    node_counts = parse_scale(args.scale)
    measured = load_measured(args.measured) if args.measured is not None else None
    cfg = compose(overrides, args.config_dir, args.config_name)
    report, rows = scaling(cfg, args.ranks_per_node, args.proposer, node_counts, args.sync_period, measured)
    model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "default model")
    title = f"{model} on {cfg.topology.name}"
    source = f"measured run {args.measured}" if measured else "the topology's peak dense_tflops and mem_bw_GBps"
    payload = {
        **report,
        "scaling": rows,
        "projection": {
            "per_rank_batch": cfg.data.global_batch_size / report["topology"]["ranks_per_node"],
            "sync_period": args.sync_period,
            "compute": source,
            "overlap_rule": OVERLAP_RULE,
            "planning": PLANNING,
            "calibration": CALIBRATION if measured else None,
        },
    }
    md = markdown(rows, title, source, CALIBRATION if measured else None)
    print(json.dumps(payload, indent=1) if args.json else md)
    if args.out is not None:
        paths = write(args.out, payload, md, title)
        print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    return 0
