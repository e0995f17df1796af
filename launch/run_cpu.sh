#!/usr/bin/env bash
# The CPU smoke run: set up if needed, then train on NPROC (default 2) Gloo ranks under torchrun.
#   bash launch/run_cpu.sh [hydra overrides...]     e.g. trainer.max_steps=50 sharding=row_wise
#   NPROC       ranks (default 2)
#   FABRIC_ENV  env file from launch/env/ to source (default none; e.g. gloo_cpu)
#   DRY_RUN=1   print the torchrun command and exit
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/common.sh
NPROC=${NPROC:-2}
require_int NPROC 1
[ "${DRY_RUN:-0}" = 1 ] || bash launch/setup.sh
load_fabric_env none
find_torchrun
run_cmd "$TORCHRUN" --standalone --nproc_per_node="$NPROC" -m dlrm.train "$@"
