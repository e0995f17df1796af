#!/usr/bin/env bash
# The CPU smoke run: set up if needed, then train on NPROC (default 2) Gloo ranks under torchrun,
# everything on loopback: the rendezvous at 127.0.0.1 on a free port, Gloo on the lo interface.
#   bash launch/run_cpu.sh [hydra overrides...]     e.g. trainer.max_steps=50 sharding=row_wise
#   NPROC       ranks (default 2); checked against topology=NAME among the overrides before starting
#   FABRIC_ENV  env file from launch/env/ to source (default none; e.g. gloo_cpu)
#   GLOO_SOCKET_IFNAME  interface Gloo binds to (default lo here)
#   OMP_NUM_THREADS     threads per rank (default 1 with several ranks, as torchrun's default)
#   TORCHRUN    torchrun to use (default: python -m dlrm.torchrun of the venv; see launch/common.sh)
#   DRY_RUN=1   print the torchrun command and exit
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/common.sh
NPROC=${NPROC:-2}
require_int NPROC 1
check_topology - NPROC "$@"
[ "${DRY_RUN:-0}" = 1 ] || bash launch/setup.sh
load_fabric_env none
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
[ "$NPROC" -eq 1 ] || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # torchrun's default, without its warning
find_torchrun
run_cmd "${TORCHRUN_CMD[@]}" "${LOCAL_RDZV_ARGS[@]}" --nproc_per_node="$NPROC" -m dlrm.train "$@"
