#!/usr/bin/env bash
# Train on several nodes: run this once on every node; the torchruns meet at a c10d rendezvous.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/run_multinode.sh topology=dgx_h100_multinode [overrides...]
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 launch/run_multinode.sh topology=dgx_h100_multinode [overrides...]
# Variables (the same on every node, except NODE_RANK):
#   NNODES          number of nodes (default 1)
#   NODE_RANK       this node's index, 0..NNODES-1 (required when NNODES > 1)
#   MASTER_ADDR     address of the node that hosts the rendezvous, reachable from all (required when NNODES > 1
#                   unless RDZV_ENDPOINT is set; 127.0.0.1 when NNODES = 1)
#   MASTER_PORT     its port (default 29500)
#   RDZV_ENDPOINT   host:port of the rendezvous (default $MASTER_ADDR:$MASTER_PORT)
#   NPROC_PER_NODE  ranks per node (default $NGPU, else 8 on a GPU machine, 2 on a CPU one)
#   RDZV_ID         job id shared by all nodes (default $SLURM_JOB_ID, else "dlrm"); names the run directory
#   RUN_DIR         run directory for every rank (default outputs/$RDZV_ID when RDZV_ID or SLURM_JOB_ID is set;
#                   else the ranks agree on outputs/<timestamp> through torchrun's store); a hydra.run.dir=
#                   override wins over both
#   FABRIC_ENV      env file from launch/env/ (default nccl_ib on GPUs, gloo_cpu on CPUs; none = nothing)
#   TORCHRUN, DLRM_ACCEL, NUMA_BINDING, DRY_RUN=1 as in launch/run_node.sh
# Arguments go to dlrm.train: Hydra overrides, and -cd DIR / -cn NAME for a team's own config directory
# (DIR must be at the same path on every node: a shared filesystem; docs/cluster.md).
# Two simulated nodes on one machine (loopback), one command per node:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 NPROC_PER_NODE=2 launch/run_multinode.sh topology=cpu_2x2 &
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=127.0.0.1 NPROC_PER_NODE=2 launch/run_multinode.sh topology=cpu_2x2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/common.sh
detect_accel

NNODES=${NNODES:-1}
require_int NNODES 1
if [ "$NNODES" -gt 1 ]; then
  [ -n "${NODE_RANK:-}" ] || die "NODE_RANK is not set; with NNODES=$NNODES set NODE_RANK=0 on the first node ... NODE_RANK=$((NNODES - 1)) on the last"
else
  NODE_RANK=${NODE_RANK:-0}
fi
require_int NODE_RANK 0
[ "$NODE_RANK" -lt "$NNODES" ] || die "NODE_RANK=$NODE_RANK is not below NNODES=$NNODES; node ranks run 0..$((NNODES - 1)): fix NODE_RANK or NNODES"

if [ "$DLRM_ACCEL" = cuda ]; then NPROC_PER_NODE=${NPROC_PER_NODE:-${NGPU:-8}}; else NPROC_PER_NODE=${NPROC_PER_NODE:-${NGPU:-2}}; fi
require_int NPROC_PER_NODE 1

if [ -z "${RDZV_ENDPOINT:-}" ]; then
  if [ -z "${MASTER_ADDR:-}" ]; then
    [ "$NNODES" -eq 1 ] || die "MASTER_ADDR is not set; with NNODES=$NNODES set MASTER_ADDR to the address of node 0 (the same on every node), or set RDZV_ENDPOINT=host:port"
    MASTER_ADDR=127.0.0.1
  fi
  MASTER_PORT=${MASTER_PORT:-29500}
  require_int MASTER_PORT 1
  [ "$MASTER_PORT" -le 65535 ] || die "MASTER_PORT=$MASTER_PORT is not a TCP port; set MASTER_PORT to 1..65535 (default 29500)"
  RDZV_ENDPOINT=$MASTER_ADDR:$MASTER_PORT
fi
[[ "$RDZV_ENDPOINT" =~ ^[^[:space:]]+:[0-9]+$ ]] || die "RDZV_ENDPOINT=$RDZV_ENDPOINT is not host:port; set RDZV_ENDPOINT=host:port (or MASTER_ADDR and MASTER_PORT)"

# One run directory for all ranks of all nodes.
if [ -n "${RDZV_ID:-}" ] || [ -n "${SLURM_JOB_ID:-}" ]; then
  RDZV_ID=${RDZV_ID:-$SLURM_JOB_ID}
  RUN_DIR=${RUN_DIR:-outputs/$RDZV_ID}
else
  RDZV_ID=dlrm
fi
[[ "$RDZV_ID" =~ ^[A-Za-z0-9_.-]+$ ]] || die "RDZV_ID=$RDZV_ID: use letters, digits, '.', '_' and '-' only (it names the run directory)"
args=("$@")
if has_override hydra.run.dir= "$@"; then
  echo "run dir: $(override_value hydra.run.dir "$@") (hydra.run.dir override; pass the same one on every node)" >&2
elif has_override run.name= "$@"; then  # a named run: dlrm.train puts it in outputs/NAME
  echo "run dir: outputs/$(override_value run.name "$@") (run.name)" >&2
elif [ -n "${RUN_DIR:-}" ]; then
  args+=("hydra.run.dir=$RUN_DIR")
  echo "run dir: $RUN_DIR" >&2
else
  echo "run dir: outputs/<timestamp>, agreed by the ranks through torchrun's store (set RDZV_ID or RUN_DIR to name it)" >&2
fi

check_topology NNODES NPROC_PER_NODE "${args[@]}"
if [ "$DLRM_ACCEL" = cuda ]; then load_fabric_env nccl_ib; else load_fabric_env gloo_cpu; fi
find_torchrun
restart_args
numa_args
run_cmd "${TORCHRUN_CMD[@]}" --nnodes="$NNODES" --nproc_per_node="$NPROC_PER_NODE" --node_rank="$NODE_RANK" \
  --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$RDZV_ID" "${RESTART_ARGS[@]}" "${NUMA_ARGS[@]}" \
  -m dlrm.train "${args[@]}"
