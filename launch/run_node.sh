#!/usr/bin/env bash
# Train on one node: torchrun with NGPU ranks (one per GPU, or Gloo ranks on a CPU machine), rendezvous on
# 127.0.0.1 at a free port (as --standalone, but on loopback).
#   NGPU=8 launch/run_node.sh [hydra overrides...]     e.g. experiment=dcn_small topology=dgx_h100
#   NGPU        ranks on this node (default 8 on a GPU machine, 2 on a CPU one)
#   TOPOLOGY    topology config used when the overrides hold no topology=... (default on GPUs: dgx_h100,
#               with topology.ranks_per_node=$NGPU when NGPU != 8; on CPUs: the config's default, cpu)
#   FABRIC_ENV  env file from launch/env/ (default nccl_base on GPUs, gloo_cpu on CPUs; none = nothing)
#   TORCHRUN    torchrun to use (default: python -m dlrm.torchrun of the venv, else torchrun on PATH)
#   DLRM_ACCEL  cpu | cuda (default: cuda if nvidia-smi lists a GPU)
#   NUMA_BINDING  on GPUs, torchrun's --numa-binding: each rank on the CPUs of its GPU's NUMA node
#               (node, the default where the numactl command is installed; socket, exclusive,
#               core-complex; none to leave the ranks unbound)
#   DRY_RUN=1   print the torchrun command and exit
# Runs from the repository root: relative paths in overrides (and -cd DIR, a team's config directory) are
# the repository's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/common.sh
detect_accel
if [ "$DLRM_ACCEL" = cuda ]; then NGPU=${NGPU:-8}; else NGPU=${NGPU:-2}; fi
require_int NGPU 1

args=("$@")
if ! has_override topology= "$@"; then
  if [ "$DLRM_ACCEL" = cuda ]; then TOPOLOGY=${TOPOLOGY:-dgx_h100}; fi
  if [ -n "${TOPOLOGY:-}" ]; then
    args+=("topology=$TOPOLOGY")
    if [ "$TOPOLOGY" = dgx_h100 ] && [ "$NGPU" != 8 ] && ! has_override topology.ranks_per_node= "$@"; then
      args+=("topology.ranks_per_node=$NGPU")
    fi
    echo "topology: $TOPOLOGY (no topology=... among the overrides; set TOPOLOGY or pass topology=NAME)" >&2
  fi
fi
check_topology - NGPU "${args[@]}"
if [ "$DLRM_ACCEL" = cuda ]; then load_fabric_env nccl_base; else load_fabric_env gloo_cpu; fi
find_torchrun
restart_args
numa_args
run_cmd "${TORCHRUN_CMD[@]}" "${LOCAL_RDZV_ARGS[@]}" --nproc_per_node="$NGPU" "${RESTART_ARGS[@]}" "${NUMA_ARGS[@]}" \
  -m dlrm.train "${args[@]}"
