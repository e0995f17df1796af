"""The dry-run planner's command.

python -m dlrm.plan [--json] [--ranks-per-node N] [--proposer P] [-cd DIR] [-cn NAME] [hydra overrides]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence

from dlrm.common.errors import ArgumentParser, UserError
from dlrm.config.compose import compose
from dlrm.plan.describe import format_report
from dlrm.plan.planner import PROPOSERS, make_plan
from dlrm.plan.scaling_cli import scaling_main


def _quiet_torchrec() -> None:
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    logging.getLogger("root").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(
        prog="python -m dlrm.plan",
        description="Sharding plan, per-rank memory and per-iteration communication, without the hardware. "
        "Other arguments are Hydra overrides, as for dlrm.train (e.g. model=mlperf_dcnv2 topology=dgx_h100).",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument(
        "-cd",
        "--config-dir",
        default=None,
        help="a directory of your config groups, searched first (as dlrm.train -cd)",
    )
    parser.add_argument("-cn", "--config-name", default=None, help="the primary config (as dlrm.train -cn)")
    parser.add_argument("--ranks-per-node", type=int, default=None, help="for topologies with ranks_per_node=null")
    parser.add_argument(
        "--proposer",
        choices=PROPOSERS,
        default="default",
        help="default: the trainer's planner (above 256 ranks a narrowed search, see dlrm.plan.large); exact: the "
        "trainer's planner at any size; greedy/uniform: one cheaper TorchRec proposer (the plan may differ)",
    )
    parser.add_argument("--scale", default=None, help="node counts, e.g. 1,2,4,8: project the step time (weak scaling)")
    parser.add_argument("--sync-period", type=int, default=4, help="with --scale: local SGD syncs every H steps")
    parser.add_argument("--measured", default=None, help="with --scale: RUN_DIR/summary.json for the compute times")
    parser.add_argument("--out", default=None, help="with --scale: write scaling.json, scaling.md, scaling.png here")
    args, overrides = parser.parse_known_args(list(argv))
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        parser.error(f"unknown option(s) {' '.join(bad)}; Hydra overrides look like key=value")
    return args, overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Run the planner for these arguments; print the report; return the exit status (0, or 2)."""
    try:
        args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
        if argv is None:  # as a command: TorchRec's warnings and INFO logs would drown the report
            _quiet_torchrec()
        if args.scale is not None:
            return scaling_main(args, overrides)
        cfg = compose(overrides, args.config_dir, args.config_name)
        report = make_plan(cfg, args.ranks_per_node, args.proposer)
    except UserError as e:  # ConfigError, PlanError, a bad option
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0
