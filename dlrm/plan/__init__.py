"""Dry-run planner: the trainer's sharding plan, memory and communication, without the hardware.

    python -m dlrm.plan [--json] [--ranks-per-node N] [--proposer P] [hydra overrides]
    python -m dlrm.plan model=mlperf_dcnv2 topology=dgx_h100 topology.nodes=16 \
        data.global_batch_size=65536 --json

The model is built on the meta device and no process group is created. It prints the plan TorchRec's
planner makes (table, sharding type, compute kernel, ranks), per-rank memory against the topology's
capacity, and per-iteration communication per rank with modelled times.

Exit status: 0 with a plan; 2 when the config is invalid or the model does not fit.
"""

from dlrm.config.compose import compose
from dlrm.distributed.capacity import PlanError
from dlrm.plan.cli import main
from dlrm.plan.describe import format_report
from dlrm.plan.planner import make_plan

__all__ = ["PlanError", "compose", "format_report", "main", "make_plan"]
