"""Dry-run planner: `python -m dlrm.plan [--json] [--ranks-per-node N] [--proposer P] [hydra overrides]`.

For any model and topology config, on any machine and without the hardware (the model is built on
the meta device, no process group is created), prints:

- the sharding plan TorchRec's planner makes for the trainer (same planner, constraints and
  optimizer as `dlrm.train`): table, sharding type, compute kernel, ranks;
- per-rank memory: sharded table weights and their optimizer state, replicated parts (dense MLPs,
  data-parallel tables, their optimizer state, dense gradients), against the capacity per rank
  (`topology.hbm_GB` on cuda, `topology.ddr_GB` on cpu);
- per-iteration communication per rank (forward + backward) for `data.global_batch_size`: the
  embedding exchange (input ids, pooled embeddings, their gradients) split into intra-node and
  inter-node bytes, and the allreduce bytes (dense gradients and data-parallel tables), with times
  from `dlrm.comms.costmodel.step_comm_time`.

Modules: `planner` (TorchRec's planner, the whole report), `memory` (per-rank HBM/DDR model),
`report` (text), `cli`; the traffic model is `dlrm.comms.traffic`, beside the cost model it feeds.

Exit status: 0 with a plan; 2 when the config is invalid or the model does not fit (the message
names the key or the rank, the needed and available GB and the fix).

Example::

    python -m dlrm.plan model=mlperf_dcnv2 topology=dgx_h100 topology.nodes=16 \\
        data.global_batch_size=65536 --json
"""

from dlrm.config.compose import compose
from dlrm.distributed.capacity import PlanError
from dlrm.plan.cli import main
from dlrm.plan.describe import format_report
from dlrm.plan.planner import make_plan

__all__ = ["PlanError", "compose", "format_report", "main", "make_plan"]
